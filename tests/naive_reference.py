"""An independent, deliberately naive numpy Transformer-XL used as the oracle in the tests.

Nothing here shares code with tfxl: the attention score of every (query, key) pair is the sum of the
paper's four terms (a) + (b) + (c) + (d) with an explicitly computed R_{i-j}, there is no rel_shift,
memory is a Python list trimmed by hand, and the softmax runs only over the keys a query may see.
"""

import numpy as np


def sinusoid(distance, d_model):
    """The encoding of one relative distance: concat(sin, cos) of distance * inverse frequency."""
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, d_model, 2, dtype=np.float64) / d_model))
    return np.concatenate([np.sin(distance * inv_freq), np.cos(distance * inv_freq)])


def layer_norm(x, gamma, beta, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def attention_weights(layer):
    """numpy copies of a RelativeMultiHeadAttention's weights, by meaning."""
    g = lambda v: np.asarray(v.numpy() if hasattr(v, "numpy") else v, np.float64)
    return dict(wq=g(layer.query_kernel), wk=g(layer.key_kernel), wv=g(layer.value_kernel),
                wr=g(layer.position_kernel), wo=g(layer.output_kernel),
                gamma=g(layer.layer_norm.gamma), beta=g(layer.layer_norm.beta))


def relative_attention(h, mem, mem_valid, w, u, v, clamp_len=-1, same_length_window=None,
                       pre_lnorm=False):
    """h [B, T, D], mem [B, M, D], mem_valid [B, M] bool; w from attention_weights; u, v [N, H].

    same_length_window: when set (the model's memory length), a query sees keys at distance
    <= window only, i.e. the same number of positions for every query.
    """
    batch, t_len, d_model = h.shape
    m_len = mem.shape[1]
    n_head = w["wq"].shape[1]
    scale = 1.0 / np.sqrt(w["wq"].shape[2])
    if pre_lnorm:
        h_in, mem_in = layer_norm(h, w["gamma"], w["beta"]), layer_norm(mem, w["gamma"], w["beta"])
    else:
        h_in, mem_in = h, mem
    keys_in = np.concatenate([mem_in, h_in], axis=1)
    valid = np.concatenate([mem_valid, np.ones((batch, t_len), bool)], axis=1)
    out = np.zeros((batch, t_len, n_head, w["wq"].shape[2]))
    for b in range(batch):
        for n in range(n_head):
            for i in range(t_len):
                q = h_in[b, i] @ w["wq"][:, n]
                scores, values = [], []
                for j in range(m_len + t_len):
                    distance = m_len + i - j
                    visible = distance >= 0 and valid[b, j] and (
                        same_length_window is None or distance <= same_length_window)
                    if not visible:
                        continue
                    if clamp_len >= 0:
                        distance = min(distance, clamp_len)
                    k = keys_in[b, j] @ w["wk"][:, n]
                    r = sinusoid(distance, d_model) @ w["wr"][:, n]
                    term_a = q @ k          # content-based addressing
                    term_b = q @ r          # content-dependent positional bias
                    term_c = u[n] @ k       # global content bias
                    term_d = v[n] @ r       # global positional bias
                    scores.append((term_a + term_b + term_c + term_d) * scale)
                    values.append(keys_in[b, j] @ w["wv"][:, n])
                scores = np.array(scores)
                p = np.exp(scores - scores.max())
                p /= p.sum()
                out[b, i, n] = p @ np.array(values)
    attn = np.einsum("btnh,nhd->btd", out, w["wo"])
    if pre_lnorm:
        return h + attn
    return layer_norm(h + attn, w["gamma"], w["beta"])


def feed_forward(h, ff, pre_lnorm=False):
    g = lambda v: np.asarray(v.numpy(), np.float64)
    gamma, beta = g(ff.layer_norm.gamma), g(ff.layer_norm.beta)
    x = layer_norm(h, gamma, beta) if pre_lnorm else h
    x = np.maximum(x @ g(ff.inner.kernel) + g(ff.inner.bias), 0.0)
    x = x @ g(ff.outer.kernel) + g(ff.outer.bias)
    return h + x if pre_lnorm else layer_norm(h + x, gamma, beta)


def adaptive_log_probs(hidden, clusters):
    """Full log-probabilities from explicit per-cluster parameters.

    clusters: list of dicts (shortlist first) with "weight" [n, d], "bias" [n], "proj" [D, d] or
    None; the first also has "cluster_weight" [C, d], "cluster_bias" [C]. Cluster i's head logit is
    at index shortlist + i - 1.
    """
    def logits(x, c, extra_w=None, extra_b=None):
        if c["proj"] is not None:
            x = x @ c["proj"]
        w, b = c["weight"], c["bias"]
        if extra_w is not None:
            w, b = np.concatenate([w, extra_w]), np.concatenate([b, extra_b])
        return x @ w.T + b

    def log_softmax(z):
        z = z - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    head = clusters[0]
    head_lp = log_softmax(logits(hidden, head, head.get("cluster_weight"),
                                 head.get("cluster_bias")))
    shortlist = head["weight"].shape[0]
    parts = [head_lp[..., :shortlist]]
    for i, c in enumerate(clusters[1:], start=1):
        parts.append(head_lp[..., shortlist + i - 1:shortlist + i] + log_softmax(logits(hidden, c)))
    return np.concatenate(parts, axis=-1)


class NaiveTransfoXL:
    """Segment-by-segment numpy model over a tfxl backbone's weights (div_val == 1, no dropout)."""

    def __init__(self, backbone):
        c = backbone.config
        self.config = c
        self.table = backbone.embedding.tables[0].numpy().astype(np.float64)
        proj = backbone.embedding.projections[0]
        self.proj = None if proj is None else proj.numpy().astype(np.float64)
        self.blocks = [(attention_weights(b.attention), b.feed_forward) for b in backbone.blocks]
        u, v = backbone.content_bias.numpy(), backbone.position_bias.numpy()
        self.u = [u[i] if c.untie_r else u for i in range(c.n_layer)]
        self.v = [v[i] if c.untie_r else v for i in range(c.n_layer)]
        self.memory = None  # list over layers of [B, m, D] real positions only (m <= mem_len)

    def step(self, ids, mem_len):
        c = self.config
        h = self.table[ids]
        if self.proj is not None:
            h = h @ self.proj
        h = h * np.sqrt(c.d_model)
        batch = ids.shape[0]
        if self.memory is None:
            self.memory = [np.zeros((batch, 0, c.d_model)) for _ in range(c.n_layer)]
        new_memory = []
        for l, (w, ff) in enumerate(self.blocks):
            mem = self.memory[l]
            new_memory.append(np.concatenate([mem, h], axis=1)[:, -mem_len:] if mem_len else
                              np.zeros((batch, 0, c.d_model)))
            valid = np.ones(mem.shape[:2], bool)
            h = relative_attention(h, mem, valid, w, self.u[l], self.v[l], c.clamp_len,
                                   mem_len if c.same_length else None, c.pre_lnorm)
            h = feed_forward(h, ff, c.pre_lnorm)
        self.memory = new_memory
        return h


# -- the counter-hash random stream (tfxl.layers.counter_hash), written independently ----------

def _mix32(h):
    """lowbias32 in numpy uint32 arrays (products wrap modulo 2^32)."""
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x7FEB352D)
    h = h ^ (h >> np.uint32(15))
    h = h * np.uint32(0x846CA68B)
    return h ^ (h >> np.uint32(16))


def hash_bits(shape, seed):
    """The documented hash: element i (row-major) is mix(mix(i ^ key1) + key2), keys from the
    two seed integers modulo 2^32."""
    s0, s1 = (np.array([v % 2**32], np.uint32) for v in seed)
    key1 = _mix32(s0 * np.uint32(0x9E3779B9) + s1)
    key2 = _mix32(key1 + s1 * np.uint32(0x85EBCA6B) + np.uint32(1))
    index = np.arange(int(np.prod(shape)), dtype=np.uint32)
    return _mix32(_mix32(index ^ key1) + key2).reshape(shape)


def gumbel_max_draw(logits, seed):
    """One index per row of float64 `logits` [B, V] (-inf: never drawn): the argmax of
    logits + Gumbel noise, the noise -log(-log(u)) with u the top 24 hash bits centred in their
    bin."""
    u = ((hash_bits(logits.shape, seed) >> np.uint32(8)).astype(np.float64) + 0.5) / 2**24
    return np.argmax(logits - np.log(-np.log(u)), axis=-1)


# -- the paper's baselines ------------------------------------------------------------------------

def _array(v):
    return np.asarray(v.numpy() if hasattr(v, "numpy") else v, np.float64)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def naive_lstm_step(x, h, c, w_x, w_h, b):
    """One LSTM step of one row, gate by gate: x [D_in], h and c [D]; w_x [D_in, 4D],
    w_h [D, 4D], b [4D] with the gates in the order input, forget, candidate, output."""
    d = h.shape[0]
    gate = lambda k: x @ w_x[:, k * d:(k + 1) * d] + h @ w_h[:, k * d:(k + 1) * d] + b[
        k * d:(k + 1) * d]
    i, f, g, o = _sigmoid(gate(0)), _sigmoid(gate(1)), np.tanh(gate(2)), _sigmoid(gate(3))
    c = f * c + i * g
    return o * np.tanh(c), c


class NaiveLSTM:
    """An `LSTMLM`'s hidden states, token by token and row by row, from its weights (a plain
    embedding table: div_val 1, d_embed = d_model; no dropout)."""

    def __init__(self, model):
        self.d_model = model.config.d_model
        self.table = _array(model.embedding.tables[0])
        self.layers = [(_array(layer.input_kernel), _array(layer.recurrent_kernel),
                        _array(layer.bias))
                       for layer in (getattr(model, f"lstm_{i}")
                                     for i in range(model.config.n_layer))]

    def run(self, token_ids, state=None):
        """Hidden states [B, T, D] of `token_ids` [B, T] from `state` ((h, c) lists of [B, D]
        per layer, default zeros); returns (hidden, the state after the last token)."""
        batch, length = token_ids.shape
        zeros = np.zeros((batch, self.d_model))
        h = [zeros.copy() for _ in self.layers] if state is None else [s.copy() for s in state[0]]
        c = [zeros.copy() for _ in self.layers] if state is None else [s.copy() for s in state[1]]
        out = np.zeros((batch, length, self.d_model))
        for b in range(batch):
            for t in range(length):
                x = self.table[token_ids[b, t]] * np.sqrt(self.d_model)
                for layer, weights in enumerate(self.layers):
                    h[layer][b], c[layer][b] = naive_lstm_step(x, h[layer][b], c[layer][b],
                                                               *weights)
                    x = h[layer][b]
                out[b, t] = x
        return out, (h, c)


class NaiveTransformer:
    """A `TransformerLM`'s hidden states from its weights: each window read on its own, every
    query attending to the keys at or before it one score at a time, post-LN (a plain embedding
    table, no dropout)."""

    def __init__(self, model):
        c = model.config
        self.d_model, self.eps = c.d_model, c.layer_norm_epsilon
        self.table = _array(model.embedding.tables[0])
        self.layers = []
        for i in range(c.n_layer):
            attention, ff = getattr(model, f"attention_{i}"), getattr(model, f"feed_forward_{i}")
            self.layers.append(dict(
                wq=_array(attention.query_kernel), wk=_array(attention.key_kernel),
                wv=_array(attention.value_kernel), wo=_array(attention.output_kernel),
                gamma=_array(attention.layer_norm.gamma), beta=_array(attention.layer_norm.beta),
                w1=_array(ff.inner.kernel), b1=_array(ff.inner.bias), w2=_array(ff.outer.kernel),
                b2=_array(ff.outer.bias), ff_gamma=_array(ff.layer_norm.gamma),
                ff_beta=_array(ff.layer_norm.beta)))

    def window(self, token_ids):
        """Hidden states [W, D] of one window of ids [W] (its positions 0..W-1)."""
        x = np.stack([self.table[t] * np.sqrt(self.d_model) + sinusoid(p, self.d_model)
                      for p, t in enumerate(token_ids)])
        for w in self.layers:
            n_head, d_head = w["wq"].shape[1:]
            attended = np.zeros_like(x)
            for i in range(len(x)):
                for n in range(n_head):
                    q = x[i] @ w["wq"][:, n]
                    scores = np.array([q @ (x[j] @ w["wk"][:, n]) / np.sqrt(d_head)
                                       for j in range(i + 1)])
                    probs = np.exp(scores - scores.max())
                    probs /= probs.sum()
                    context = sum(p * (x[j] @ w["wv"][:, n]) for j, p in enumerate(probs))
                    attended[i] += context @ w["wo"][n]
            x = layer_norm(x + attended, w["gamma"], w["beta"], self.eps)
            inner = np.maximum(x @ w["w1"] + w["b1"], 0.0)
            x = layer_norm(x + inner @ w["w2"] + w["b2"], w["ff_gamma"], w["ff_beta"], self.eps)
        return x

    def sliding(self, tokens, width):
        """Hidden state of every token of the 1-D `tokens`, each read by a fresh pass over its
        window: the up to width - 1 tokens before it and itself (the last position scored)."""
        return np.stack([self.window(tokens[max(0, t - width + 1):t + 1])[-1]
                         for t in range(len(tokens))])
