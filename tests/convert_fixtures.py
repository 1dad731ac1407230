"""Synthetic Transformer-XL checkpoints in the published layouts, their file writers, and numpy
forward passes that follow the *original* code's formulas on the *original* tensors.

Nothing here imports tfxl: the reference forward passes work time-major ([T, B, ...]) like
mem_transformer.py / tf/model.py, use the fused qkv weight as stored, PyTorch's [out, in] Linear
layout (x @ W.T), the original rel_shift pad-and-reshape trick, and each release's own
adaptive-softmax cluster order. The tests compare the converted tfxl model against these.
"""

import struct
import zipfile

import numpy as np


# ------------------------------------------------------------------------------------------------
# Hyper-parameters
def hparams(**kw):
    hp = dict(vocab_size=40, n_layer=2, d_model=16, n_head=2, d_head=4, d_inner=24, d_embed=16,
              div_val=2, cutoffs=(10, 25), tie_weight=True, tie_projs=(False, True, True),
              proj_same_dim=True, untie_r=False, mem_len=6, tgt_len=5)
    hp.update(kw)
    return hp


def clusters(hp):
    """(start, end, dim) per cluster, shortlist first."""
    bounds = [0, *hp["cutoffs"], hp["vocab_size"]]
    return [(bounds[i], bounds[i + 1], hp["d_embed"] // hp["div_val"] ** i)
            for i in range(len(bounds) - 1)]


def _rand(rng, *shape, scale=0.3):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# ------------------------------------------------------------------------------------------------
# PyTorch MemTransformerLM / Hugging Face TransfoXLLMHeadModel state dicts
def pytorch_state(hp, seed=0, huggingface=False, shared_r_per_layer=False):
    """A state dict with the names and shapes of the reference PyTorch modules.

    Tied parameters are the *same* numpy object under both names (as torch's state_dict lists a
    shared Parameter under each module that holds it).
    """
    rng = np.random.default_rng(seed)
    D, N, H, F, V, de = (hp["d_model"], hp["n_head"], hp["d_head"], hp["d_inner"],
                         hp["vocab_size"], hp["d_embed"])
    P = "transformer." if huggingface else ""
    cl = clusters(hp)
    s = {}
    emb_w, emb_p = [], []
    if hp["div_val"] == 1:
        emb_w.append(_rand(rng, V, de))
        s[P + "word_emb.emb_layers.0.weight"] = emb_w[0]
        if D != de:
            emb_p.append(_rand(rng, D, de))
            s[P + "word_emb.emb_projs.0"] = emb_p[0]
    else:
        for i, (a, b, d) in enumerate(cl):
            emb_w.append(_rand(rng, b - a, d))
            emb_p.append(_rand(rng, D, d))
            s[f"{P}word_emb.emb_layers.{i}.weight"] = emb_w[i]
            s[f"{P}word_emb.emb_projs.{i}"] = emb_p[i]
    s[P + "pos_emb.inv_freq"] = (1 / 10000 ** (np.arange(0, D, 2.0) / D)).astype(np.float32)
    for l in range(hp["n_layer"]):
        a, f = f"{P}layers.{l}.dec_attn.", f"{P}layers.{l}.pos_ff."
        s[a + "qkv_net.weight"] = _rand(rng, 3 * N * H, D)
        s[a + "r_net.weight"] = _rand(rng, N * H, D)
        s[a + "o_net.weight"] = _rand(rng, D, N * H)
        s[a + "layer_norm.weight"] = 1 + _rand(rng, D, scale=0.1)
        s[a + "layer_norm.bias"] = _rand(rng, D, scale=0.1)
        s[f + "CoreNet.0.weight"] = _rand(rng, F, D)
        s[f + "CoreNet.0.bias"] = _rand(rng, F, scale=0.1)
        s[f + "CoreNet.3.weight"] = _rand(rng, D, F)
        s[f + "CoreNet.3.bias"] = _rand(rng, D, scale=0.1)
        s[f + "layer_norm.weight"] = 1 + _rand(rng, D, scale=0.1)
        s[f + "layer_norm.bias"] = _rand(rng, D, scale=0.1)
    for name in ("r_w_bias", "r_r_bias"):
        if hp["untie_r"]:
            if huggingface:
                for l in range(hp["n_layer"]):
                    s[f"{P}layers.{l}.dec_attn.{name}"] = _rand(rng, N, H)
            else:  # NVIDIA-style stacked layout
                s[name] = _rand(rng, hp["n_layer"], N, H)
        else:
            s[P + name] = _rand(rng, N, H)
            if shared_r_per_layer:
                for l in range(hp["n_layer"]):
                    s[f"{P}layers.{l}.dec_attn.{name}"] = s[P + name]
    C = len(cl) - 1
    if C:
        s["crit.cluster_weight"] = _rand(rng, C, de)
        s["crit.cluster_bias"] = _rand(rng, C)
    tie_projs = hp["tie_projs"]
    if hp["div_val"] == 1:
        s["crit.out_layers.0.weight"] = emb_w[0] if hp["tie_weight"] else _rand(rng, V, de)
        s["crit.out_layers.0.bias"] = _rand(rng, V)
        if D != de:
            for i in range(len(cl)):
                s[f"crit.out_projs.{i}"] = emb_p[0] if tie_projs[i] else _rand(rng, D, de)
    else:
        for i, (a, b, d) in enumerate(cl):
            s[f"crit.out_layers.{i}.weight"] = (emb_w[i] if hp["tie_weight"]
                                                else _rand(rng, b - a, d))
            s[f"crit.out_layers.{i}.bias"] = _rand(rng, b - a)
            s[f"crit.out_projs.{i}"] = emb_p[i] if tie_projs[i] else _rand(rng, D, d)
    return s


def drop_tied_duplicates(state):
    """What save_pretrained(safe_serialization=True) writes: one name per shared tensor (the
    softmax aliases are dropped)."""
    seen, out = {}, {}
    for name, value in sorted(state.items(), key=lambda kv: kv[0].startswith("crit.")):
        if id(value) in seen:
            continue
        seen[id(value)] = name
        out[name] = value
    return out


def _layer_norm(x, g, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def _log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _rel_shift(x):
    """The reference trick on [qlen, klen, ...]: pad a zero column in front, view as
    [klen + 1, qlen, ...], drop the first row, view back."""
    q, k = x.shape[:2]
    padded = np.concatenate([np.zeros((q, 1) + x.shape[2:], x.dtype), x], axis=1)
    return padded.reshape((k + 1, q) + x.shape[2:])[1:].reshape(x.shape)


def _pos_emb(klen, d_model):
    pos_seq = np.arange(klen - 1, -1, -1.0)
    inv_freq = 1 / (10000 ** (np.arange(0.0, d_model, 2.0) / d_model))
    sinusoid = np.outer(pos_seq, inv_freq)
    return np.concatenate([np.sin(sinusoid), np.cos(sinusoid)], -1)  # [klen, D]


def _rel_attention(w, mem, r, qkv, r_net, o_net, rw, rr, ln_g, ln_b, n_head, d_head, eps,
                   kernel_in_out):
    """One RelPartialLearnableMultiHeadAttn (post-LN) step, time-major w [Q, B, D]."""
    q_len, bsz = w.shape[:2]
    cat = np.concatenate([mem, w], 0) if mem is not None else w
    lin = (lambda x, k: x @ k) if kernel_in_out else (lambda x, k: x @ k.T)
    heads = lin(cat, qkv)
    w_q, w_k, w_v = np.split(heads, 3, axis=-1)
    w_q = w_q[-q_len:]
    k_len = w_k.shape[0]
    w_q = w_q.reshape(q_len, bsz, n_head, d_head)
    w_k = w_k.reshape(k_len, bsz, n_head, d_head)
    w_v = w_v.reshape(k_len, bsz, n_head, d_head)
    r_k = lin(r, r_net).reshape(r.shape[0], n_head, d_head)
    ac = np.einsum("ibnd,jbnd->ijbn", w_q + rw, w_k)
    bd = _rel_shift(np.einsum("ibnd,jnd->ijbn", w_q + rr, r_k))
    score = (ac + bd) / np.sqrt(d_head)
    m_len = k_len - q_len
    mask = np.triu(np.ones((q_len, k_len)), 1 + m_len).astype(bool)
    score = np.where(mask[:, :, None, None], -np.inf, score)
    prob = np.exp(score - score.max(1, keepdims=True))
    prob /= prob.sum(1, keepdims=True)
    vec = np.einsum("ijbn,jbnd->ibnd", prob, w_v).reshape(q_len, bsz, n_head * d_head)
    return _layer_norm(w + lin(vec, o_net), ln_g, ln_b, eps)


def _adaptive_log_probs(hidden, hp, weight, bias, proj, cluster_w, cluster_b, cluster_index,
                        proj_apply):
    """Full log-probs [..., V]: weight(i) [n_i, d_i], bias(i), proj(i) or None."""
    cl = clusters(hp)

    def logit(x, w, b, p):
        return (proj_apply(x, p) if p is not None else x) @ w.T + b

    if len(cl) == 1:
        return _log_softmax(logit(hidden, weight(0), bias(0), proj(0)))
    head = _log_softmax(logit(hidden, np.concatenate([weight(0), cluster_w]),
                              np.concatenate([bias(0), cluster_b]), proj(0)))
    parts = [head[..., :hp["cutoffs"][0]]]
    for i in range(1, len(cl)):
        tail = _log_softmax(logit(hidden, weight(i), bias(i), proj(i)))
        parts.append(head[..., cluster_index(i)][..., None] + tail)
    return np.concatenate(parts, -1)


def pytorch_reference(state, hp, segments, huggingface=False):
    """Log-probs [B, T, V] for each batch-major segment, carrying mems like MemTransformerLM."""
    s = {k: np.asarray(v, np.float64) for k, v in state.items()}
    P = "transformer." if huggingface else ""
    D, N, H = hp["d_model"], hp["n_head"], hp["d_head"]
    cl = clusters(hp)
    eps = 1e-5
    mems, outputs = None, []
    for ids_bt in segments:
        ids = ids_bt.T  # time-major [T, B]
        if hp["div_val"] == 1:
            emb = s[P + "word_emb.emb_layers.0.weight"][ids]
            if D != hp["d_embed"]:
                emb = emb @ s[P + "word_emb.emb_projs.0"].T
        else:
            emb = np.zeros(ids.shape + (D,))
            for i, (a, b, _) in enumerate(cl):
                inside = (ids >= a) & (ids < b)
                e = s[f"{P}word_emb.emb_layers.{i}.weight"][np.clip(ids - a, 0, b - a - 1)]
                emb += np.where(inside[..., None], e @ s[f"{P}word_emb.emb_projs.{i}"].T, 0.0)
        core = emb * D ** 0.5
        m_len = 0 if mems is None else mems[0].shape[0]
        r = _pos_emb(m_len + ids.shape[0], D)
        hids = [core]
        for l in range(hp["n_layer"]):
            a, f = f"{P}layers.{l}.dec_attn.", f"{P}layers.{l}.pos_ff."
            if hp["untie_r"]:
                if huggingface:
                    rw, rr = s[a + "r_w_bias"], s[a + "r_r_bias"]
                else:
                    rw, rr = s["r_w_bias"][l], s["r_r_bias"][l]
            else:
                rw, rr = s[P + "r_w_bias"], s[P + "r_r_bias"]
            core = _rel_attention(core, None if mems is None else mems[l], r,
                                  s[a + "qkv_net.weight"], s[a + "r_net.weight"],
                                  s[a + "o_net.weight"], rw, rr, s[a + "layer_norm.weight"],
                                  s[a + "layer_norm.bias"], N, H, eps, kernel_in_out=False)
            ff = np.maximum(core @ s[f + "CoreNet.0.weight"].T + s[f + "CoreNet.0.bias"], 0)
            ff = ff @ s[f + "CoreNet.3.weight"].T + s[f + "CoreNet.3.bias"]
            core = _layer_norm(core + ff, s[f + "layer_norm.weight"], s[f + "layer_norm.bias"],
                               eps)
            hids.append(core)
        mems = [np.concatenate([m, h], 0)[-hp["mem_len"]:] if mems is not None else
                h[-hp["mem_len"]:] for m, h in zip(mems or [None] * len(hids), hids[:-1])]

        if hp["div_val"] == 1:
            def weight(i):
                a, b, _ = cl[i]
                return s["crit.out_layers.0.weight"][a:b]

            def bias(i):
                a, b, _ = cl[i]
                return s["crit.out_layers.0.bias"][a:b]
        else:
            def weight(i):
                return s[f"crit.out_layers.{i}.weight"]

            def bias(i):
                return s[f"crit.out_layers.{i}.bias"]

        def proj(i):
            return s.get(f"crit.out_projs.{i}")

        C = len(cl) - 1
        # The original code reads cluster i at head[:, -i]; Hugging Face at cutoffs[0] + i - 1.
        if huggingface:
            index = lambda i: hp["cutoffs"][0] + i - 1
        else:
            index = lambda i: hp["cutoffs"][0] + C - i  # == -i of a [S + C] head
        lp = _adaptive_log_probs(core, hp, weight, bias, proj, s.get("crit.cluster_weight"),
                                 s.get("crit.cluster_bias"), index,
                                 proj_apply=lambda x, p: x @ p)  # F.linear(x, p.t())
        outputs.append(lp.transpose(1, 0, 2))
    return outputs


# ------------------------------------------------------------------------------------------------
# TF1 (tf/model.py) variables
def tf1_variables(hp, seed=0, with_optimizer=True):
    rng = np.random.default_rng(seed)
    D, N, H, F, V, de = (hp["d_model"], hp["n_head"], hp["d_head"], hp["d_inner"],
                         hp["vocab_size"], hp["d_embed"])
    T = "transformer/"
    cl = clusters(hp)
    v = {}
    if hp["div_val"] == 1:
        v[T + "adaptive_embed/lookup_table"] = _rand(rng, V, de)
        if D != de:
            v[T + "adaptive_embed/proj_W"] = _rand(rng, de, D)
    else:
        for i, (a, b, d) in enumerate(cl):
            v[f"{T}adaptive_embed/cutoff_{i}/lookup_table"] = _rand(rng, b - a, d)
            if not (d == D and not hp["proj_same_dim"]):
                v[f"{T}adaptive_embed/cutoff_{i}/proj_W"] = _rand(rng, d, D)
    shape = (hp["n_layer"], N, H) if hp["untie_r"] else (N, H)
    v[T + "r_w_bias"] = _rand(rng, *shape)
    v[T + "r_r_bias"] = _rand(rng, *shape)
    for l in range(hp["n_layer"]):
        a, f = f"{T}layer_{l}/rel_attn/", f"{T}layer_{l}/ff/"
        v[a + "qkv/kernel"] = _rand(rng, D, 3 * N * H)
        v[a + "r/kernel"] = _rand(rng, D, N * H)
        v[a + "o/kernel"] = _rand(rng, N * H, D)
        v[a + "LayerNorm/gamma"] = 1 + _rand(rng, D, scale=0.1)
        v[a + "LayerNorm/beta"] = _rand(rng, D, scale=0.1)
        v[f + "layer_1/kernel"] = _rand(rng, D, F)
        v[f + "layer_1/bias"] = _rand(rng, F, scale=0.1)
        v[f + "layer_2/kernel"] = _rand(rng, F, D)
        v[f + "layer_2/bias"] = _rand(rng, D, scale=0.1)
        v[f + "LayerNorm/gamma"] = 1 + _rand(rng, D, scale=0.1)
        v[f + "LayerNorm/beta"] = _rand(rng, D, scale=0.1)
    S = T + "adaptive_softmax/"
    if len(cl) == 1:
        v[S + "bias"] = _rand(rng, V)
    else:
        for i, (a, b, d) in enumerate(cl):
            v[f"{S}cutoff_{i}/b"] = _rand(rng, b - a)
            untied_needs_proj = not ((hp["div_val"] == 1 or not hp["proj_same_dim"]) and d == D)
            if not hp["tie_projs"][i] and untied_needs_proj:
                v[f"{S}cutoff_{i}/proj"] = _rand(rng, d, D)
        v[S + "cutoff_0/cluster_W"] = _rand(rng, len(cl) - 1, de)
        v[S + "cutoff_0/cluster_b"] = _rand(rng, len(cl) - 1)
    if with_optimizer:
        for name in list(v):
            v[name + "/Adam"] = np.zeros_like(v[name])
            v[name + "/Adam_1"] = np.ones_like(v[name])
        v["global_step"] = np.array(1000, np.int64)
        v["beta1_power"] = np.array(0.5, np.float32)
    return v


def tf1_reference(v, hp, segments):
    """Log-probs [B, T, V] per segment following tf/model.py (mask_adaptive_* variants)."""
    v = {k: np.asarray(x, np.float64) for k, x in v.items()}
    T = "transformer/"
    D, N, H = hp["d_model"], hp["n_head"], hp["d_head"]
    cl = clusters(hp)
    eps = 1e-12  # tf.contrib.layers.layer_norm
    mems, outputs = None, []
    for ids_bt in segments:
        ids = ids_bt.T
        if hp["div_val"] == 1:
            table = v[T + "adaptive_embed/lookup_table"]
            proj_w = v.get(T + "adaptive_embed/proj_W")
            emb = table[ids]
            if proj_w is not None:
                emb = np.einsum("ibe,ed->ibd", emb, proj_w)
            tables, projs = None, None
        else:
            emb = np.zeros(ids.shape + (D,))
            tables, projs = [], []
            for i, (a, b, _) in enumerate(cl):
                t = v[f"{T}adaptive_embed/cutoff_{i}/lookup_table"]
                p = v.get(f"{T}adaptive_embed/cutoff_{i}/proj_W")
                tables.append(t)
                projs.append(p)
                inside = (ids >= a) & (ids < b)
                e = t[np.clip(ids - a, 0, b - a - 1)]
                if p is not None:
                    e = e @ p
                emb += np.where(inside[..., None], e, 0.0)
        out = emb * D ** 0.5
        m_len = 0 if mems is None else mems[0].shape[0]
        r = _pos_emb(m_len + ids.shape[0], D)
        new_mems = []
        for l in range(hp["n_layer"]):
            prev = None if mems is None else mems[l]
            new_mems.append(out if prev is None else np.concatenate([prev, out])[-hp["mem_len"]:])
            a, f = f"{T}layer_{l}/rel_attn/", f"{T}layer_{l}/ff/"
            rw = v[T + "r_w_bias"][l] if hp["untie_r"] else v[T + "r_w_bias"]
            rr = v[T + "r_r_bias"][l] if hp["untie_r"] else v[T + "r_r_bias"]
            out = _rel_attention(out, prev, r, v[a + "qkv/kernel"], v[a + "r/kernel"],
                                 v[a + "o/kernel"], rw, rr, v[a + "LayerNorm/gamma"],
                                 v[a + "LayerNorm/beta"], N, H, eps, kernel_in_out=True)
            ff = np.maximum(out @ v[f + "layer_1/kernel"] + v[f + "layer_1/bias"], 0)
            ff = ff @ v[f + "layer_2/kernel"] + v[f + "layer_2/bias"]
            out = _layer_norm(ff + out, v[f + "LayerNorm/gamma"], v[f + "LayerNorm/beta"], eps)
        mems = new_mems
        S = T + "adaptive_softmax/"
        if hp["div_val"] == 1:
            def weight(i):
                return table[cl[i][0]:cl[i][1]]
        else:
            def weight(i):
                return tables[i]
        if len(cl) == 1:
            def bias(i):
                return v[S + "bias"]

            def proj(i):
                return proj_w
        else:
            def bias(i):
                return v[f"{S}cutoff_{i}/b"]

            def proj(i):
                if hp["tie_projs"][i]:
                    return proj_w if hp["div_val"] == 1 else projs[i]
                return v.get(f"{S}cutoff_{i}/proj")
        lp = _adaptive_log_probs(out, hp, weight, bias, proj, v.get(S + "cutoff_0/cluster_W"),
                                 v.get(S + "cutoff_0/cluster_b"),
                                 lambda i: hp["cutoffs"][0] + i - 1,
                                 proj_apply=lambda x, p: np.einsum("ibd,ed->ibe", x, p))
        outputs.append(lp.transpose(1, 0, 2))
    return outputs


# ------------------------------------------------------------------------------------------------
# Writers
class _PickleWriter:
    """Hand-assembled pickle protocol 2, naming the torch globals torch.save would."""

    def __init__(self):
        self.out = bytearray(b"\x80\x02")

    def glob(self, module, name):
        self.out += b"c" + module.encode() + b"\n" + name.encode() + b"\n"

    def string(self, text):
        data = text.encode()
        self.out += b"X" + struct.pack("<I", len(data)) + data

    def integer(self, value):
        self.out += b"J" + struct.pack("<i", value)

    def int_tuple(self, values):
        self.out += b"("
        for value in values:
            self.integer(value)
        self.out += b"t"

    def empty_ordered_dict(self):
        self.glob("collections", "OrderedDict")
        self.out += b")R"


_STORAGE_CLASS = {np.dtype("float32"): "FloatStorage", np.dtype("float16"): "HalfStorage",
                  np.dtype("float64"): "DoubleStorage", np.dtype("int64"): "LongStorage"}


def write_torch_zip(path, state, transposed=(), root="archive", strides=None):
    """A torch.save-style zip of a state dict of numpy arrays.

    Arrays that are the same object share one storage (as tied parameters do). Names in
    `transposed` are stored column-major (a transposed view: stride (1, rows)) to exercise
    strided rebuilds. `strides` {name: stride} writes that stride for a name, whatever it is
    (a damaged or hostile file).
    """
    w = _PickleWriter()
    storages, keys = [], {}
    w.empty_ordered_dict()
    w.out += b"("
    for name, array in state.items():
        array = np.asarray(array)
        if id(array) not in keys:
            data = array.T if name in transposed else array
            keys[id(array)] = str(len(storages))
            storages.append(np.ascontiguousarray(data).astype(data.dtype.newbyteorder("<")))
        key = keys[id(array)]
        if name in transposed:
            stride = (1, array.shape[0])
        else:
            stride = tuple(int(np.prod(array.shape[i + 1:])) for i in range(array.ndim))
        stride = (strides or {}).get(name, stride)
        w.string(name)
        w.glob("torch._utils", "_rebuild_tensor_v2")
        w.out += b"("
        w.out += b"("
        w.string("storage")
        w.glob("torch", _STORAGE_CLASS[array.dtype])
        w.string(key)
        w.string("cpu")
        w.integer(int(array.size))
        w.out += b"tQ"
        w.integer(0)
        w.int_tuple(array.shape)
        w.int_tuple(stride)
        w.out += b"\x89"          # requires_grad=False
        w.empty_ordered_dict()    # backward_hooks
        w.out += b"tR"
    w.out += b"u."
    _write_zip(path, root, bytes(w.out), {k: s.tobytes() for k, s in
                                          zip(map(str, range(len(storages))), storages)})


def _write_zip(path, root, pickle_bytes, storages):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{root}/data.pkl", pickle_bytes)
        z.writestr(f"{root}/byteorder", "little")
        for key, data in storages.items():
            z.writestr(f"{root}/data/{key}", data)
        z.writestr(f"{root}/version", "3\n")


def write_malicious_torch_zip(path, marker):
    """A torch zip whose pickle calls os.system('touch <marker>')."""
    w = _PickleWriter()
    w.glob("os", "system")
    w.string(f"touch {marker}")
    w.out += b"\x85R."            # TUPLE1, REDUCE, STOP
    _write_zip(path, "archive", bytes(w.out), {})


def write_safetensors(path, state):
    """A .safetensors file as Hugging Face writes it (metadata format "pt")."""
    from safetensors.numpy import save_file  # only here: the optional `convert` extra

    save_file({name: np.ascontiguousarray(array) for name, array in state.items()}, str(path),
              metadata={"format": "pt"})


def write_tf1_checkpoint(prefix, variables):
    """A name-based (TF1 Saver V2) checkpoint with exactly these variable names."""
    import tensorflow as tf  # only here: the rest of this module is numpy

    names = sorted(variables)
    tf.raw_ops.SaveV2(prefix=str(prefix), tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[tf.constant(variables[n]) for n in names])
    return str(prefix)
