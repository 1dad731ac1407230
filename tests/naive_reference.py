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
