"""Relative multi-head attention of Transformer-XL (Dai et al. 2019, section 3.3).

Shape glossary: B batch, T query (segment) length, M memory length, K = M + T key length,
D model size, N heads, H head size.

For query i (absolute key position M + i) and key j, with R the sinusoidal encoding of the distance
M + i - j, the score is
    (q_i + u) . k_j            terms (a) + (c): content, one einsum "AC"
  + (q_i + v) . W_k,R R_{M+i-j} terms (b) + (d): position, one einsum "BD" (`position_score`)
scaled by 1/sqrt(H). Queries come from the current segment only; keys and values from
[memory; segment] (the memory arrives already stop-gradient).

The layer owns no memory layout. Its memory argument is one layer of a memory type
(`tfxl.layers.memory`), which says how the segment's rows become the keys and values attended to
(layer inputs re-projected with the segment's: training, W_k and W_v learn through the memory
rows; cached keys and values with the segment's appended; rows written into fixed buffers) and
how the position scores line up with those keys. `compute_attention` then scores every layout
with one code path, as Model Garden's `MultiHeadAttention.compute_attention` does.
"""

import functools
import math

import keras
from keras import ops

from tfxl.layers.dropout import HashDropout
from tfxl.layers.memory import as_layer_view


def rel_shift(x):
    """Aligns position scores to relative distances: out[..., i, j] = x[..., i, j + T - 1 - i].

    `x` is [..., T, K] where column m holds the score against the encoding of distance K - 1 - m.
    Query i and key j are at distance (M + i) - j, i.e. column m = T - 1 - i + j, which is what the
    identity above reads. The trick: pad one zero column in front ([T, K + 1]), view the same
    row-major buffer as [K + 1, T], drop the first row, and view the rest as [T, K]. Element (i, j)
    of the result is element T + i*K + j of the padded buffer = row i, column j + T - i of the
    padded matrix = x[i, j + T - 1 - i]. Entries with j > M + i read past the row; they are junk
    that the causal mask always hides.
    """
    return rel_shift_prepadded(ops.pad(x, [[0, 0]] * (len(x.shape) - 1) + [[1, 0]]))


def rel_shift_prepadded(x):
    """`rel_shift` of scores that already carry the zero column: x is [..., T, K + 1] with column 0
    the score against an all-zero encoding. Same result as `rel_shift(x[..., 1:])` without
    materialising a padded copy.
    """
    dims = _dims(x)
    *lead, q_len, k_len_1 = dims
    shifted = ops.reshape(x, (*lead, k_len_1, q_len))[..., 1:, :]
    return ops.reshape(shifted, (*lead, q_len, k_len_1 - 1))


def _dims(x):
    return [d if d is not None else ops.shape(x)[a] for a, d in enumerate(x.shape)]


def _concatenate(parts):
    return parts[0] if len(parts) == 1 else ops.concatenate(parts, axis=-1)


def _project(x, kernel):
    """x [..., D] times kernel [D, *out] as one 2-D matmul -> [..., *out], in x's dtype (outside
    a layer call, e.g. precomputing position keys, Keras does not autocast the kernel)."""
    x_dims, k_dims = _dims(x), list(kernel.shape)
    kernel = ops.cast(kernel, x.dtype)
    out = ops.matmul(ops.reshape(x, (-1, x_dims[-1])), ops.reshape(kernel, (k_dims[0], -1)))
    return ops.reshape(out, (*x_dims[:-1], *k_dims[1:]))


def build_attention_parts(layer, hidden_shape, projections):
    """Builds on `layer` (with d_model, n_head, d_head, init_std, layer_norm_epsilon, dropout,
    dropatt) the parts tfxl's attention layers share, in this order, which is their weights'
    order in a checkpoint: a [D, N, H] kernel `<name>_kernel` per name of `projections`, the
    output kernel [N, H, D], the LayerNorm, and the attention and output dropouts."""
    init = keras.initializers.RandomNormal(stddev=layer.init_std)
    heads = (layer.d_model, layer.n_head, layer.d_head)
    for name in projections:
        setattr(layer, f"{name}_kernel", layer.add_weight(name=f"{name}_kernel", shape=heads,
                                                          initializer=init))
    layer.output_kernel = layer.add_weight(
        name="output_kernel", shape=(layer.n_head, layer.d_head, layer.d_model), initializer=init)
    # Sublayers take the layer's dtype policy: under a mixed policy given to this layer alone, a
    # float32 sublayer would cast its input back to float32.
    policy = layer.dtype_policy
    layer.layer_norm = keras.layers.LayerNormalization(
        epsilon=layer.layer_norm_epsilon, name="layer_norm", dtype=policy)
    layer.layer_norm.build(hidden_shape)
    layer.attention_dropout = HashDropout(layer.dropatt, name="attention_dropout", dtype=policy)
    layer.output_dropout = HashDropout(layer.dropout, name="output_dropout", dtype=policy)


@keras.saving.register_keras_serializable(package="tfxl")
class RelativeMultiHeadAttention(keras.layers.Layer):
    """Relative multi-head attention with residual connection and LayerNorm.

    The position scheme is two methods, `project_positions` and `position_score`: a subclass that
    overrides them is a new scheme, and `TransformerXLBlock(attention_cls=...)` takes it.

    Args:
      d_model: D. n_head: N. d_head: H.
      dropout: rate on the attention output (before the residual).
      dropatt: rate on the attention probabilities.
      pre_lnorm: normalise the input (memory included) before attention and add the residual
        without a final LayerNorm; default is post-LN: LayerNorm(input + attention).
      init_std: std of the normal initialiser of the projections.

    Call args:
      hidden: [B, T, D] the current segment.
      memory: this layer's memory: `memory.layer(l)` of a memory type, or its layer inputs
        [B, M, D] (may have M = 0), or a pair (keys [B, N, H, M], values [B, N, M, H]) from
        `project_memory` or earlier calls' outputs.
      position_keys: `project_positions(R)` for the K = M + T distances of this call; inference
        computes it once per pass and reuses it for every segment of that shape.
      mask: [B, 1, T, K] bool, True where the query may attend to the key.
      content_bias: u, [N, H]. position_bias: v, [N, H].
    Returns:
      (output [B, T, D], what the memory's layer wrote): for layer inputs and key/value pairs the
      segment's own rows (keys [B, N, H, T], values [B, N, T, H]), what a key/value memory
      appends; for buffers, the buffers with the rows written.

    Examples:
    ```python
    import numpy as np
    from tfxl.layers import RelativeMultiHeadAttention, RelativePositionEncoding, attention_mask

    layer = RelativeMultiHeadAttention(d_model=16, n_head=2, d_head=8)
    hidden = np.random.rand(1, 4, 16).astype("float32")   # B 1, T 4
    memory = np.random.rand(1, 3, 16).astype("float32")   # M 3 layer inputs
    layer.build(hidden.shape)
    position_keys = layer.project_positions(RelativePositionEncoding(16)(key_length=7))
    mask = attention_mask(np.ones((1, 3), bool), 4)
    u = v = np.zeros((2, 8), "float32")
    output, (keys, values) = layer(hidden, memory, position_keys, mask, u, v)
    assert output.shape == (1, 4, 16) and keys.shape == (1, 2, 8, 4)
    ```
    """

    def __init__(self, d_model, n_head, d_head, dropout=0.0, dropatt=0.0, pre_lnorm=False,
                 init_std=0.02, layer_norm_epsilon=1e-5, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.n_head, self.d_head = int(d_model), int(n_head), int(d_head)
        self.dropout, self.dropatt = float(dropout), float(dropatt)
        self.pre_lnorm = bool(pre_lnorm)
        self.init_std = float(init_std)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.scale = 1.0 / math.sqrt(self.d_head)

    def build(self, hidden_shape):
        # W_q, W_k,E, W_v act on token states; W_k,R acts on position encodings only (no bias, as
        # the reference code).
        build_attention_parts(self, hidden_shape, ("query", "key", "value", "position"))

    # -- projections --------------------------------------------------------------------------
    def normalized(self, rows):
        """Rows [B, R, D] as the projections read them: LayerNorm'd under pre_lnorm."""
        return self.layer_norm(rows) if self.pre_lnorm else rows

    def key_value(self, rows):
        """Keys [B, N, H, R] and values [B, N, R, H] of normalised rows [B, R, D], one GEMM.

        Plain 2-D matmuls ([rows, D] x [D, 2*N*H]): their weight gradients are one GEMM instead
        of a batched matmul plus a reduction (what einsum's gradient builds). Keys come out as
        each head's [H, R] matrix, the layout every memory stores them in (q . k is then a plain
        matmul reading them in place).
        """
        n, h = self.n_head, self.d_head
        kernel = ops.concatenate([ops.reshape(self.key_kernel, (self.d_model, n * h)),
                                  ops.reshape(self.value_kernel, (self.d_model, n * h))], axis=-1)
        keys, values = ops.split(_project(rows, ops.reshape(kernel, (self.d_model, 2 * n, h))),
                                 2, axis=2)  # [B, R, N, H] each (split: a cheap gradient)
        return ops.transpose(keys, (0, 2, 3, 1)), ops.transpose(values, (0, 2, 1, 3))

    def project_memory(self, memory_state):
        """Keys [B, N, H, M] and values [B, N, M, H] of a layer-input memory [B, M, D]: what
        inference caches."""
        return self.key_value(self.normalized(ops.cast(memory_state, self.compute_dtype)))

    def project_positions(self, position_encoding):
        """W_k,R R: position keys [N, H, K + 1] for R [K, D] (distances K-1 ... 0).

        Depends on K, clamp_len and the weights only. Column 0 is the projection of an all-zero
        encoding, so `position_score` comes out with the zero column rel_shift needs and no
        padded copy of [B, N, T, K] is made; each head's [H, K + 1] matrix is read in place.
        """
        position_encoding = ops.pad(ops.cast(position_encoding, self.compute_dtype),
                                    [[1, 0], [0, 0]])
        return ops.transpose(_project(position_encoding, self.position_kernel), (1, 2, 0))

    def position_score(self, query, position_keys):
        """Terms (b) + (d): (q_i + v) . W_k,R R_{M+i-j} for every query i and key j, keys
        oldest first with the T queries last.

        query: q + v, [B, N, T, H]. position_keys: [N, H, K + 1]. Returns [B, N, T, K].
        """
        score = ops.einsum("bnth,nhk->bntk", query, position_keys)  # column m: distance K - m
        return rel_shift_prepadded(score)

    # -- attention ----------------------------------------------------------------------------
    def compute_attention(self, query, keys, position_keys, mask, content_bias, position_bias,
                          training=None):
        """Attention contexts [B, T, N, H] of `query` [B, N, T, H] over `keys` (an `AttendedKeys`:
        key and value parts, and the position scores in their order).

        The one place scores are computed, for every memory type: the memory lays the keys out
        and lines the position scores up with them (`keys.position_score`), the mask says which
        keys each query sees.
        """
        query_u = query + ops.cast(content_bias, query.dtype)[:, None, :]  # u: [N, 1, H]
        query_v = query + ops.cast(position_bias, query.dtype)[:, None, :]
        # Key parts stay separate tensors (scores concatenated instead): copying M cached rows
        # each step to join them would cost more than attending to them.
        content_score = _concatenate([ops.einsum("bnth,bnhk->bntk", query_u, k)       # AC
                                      for k in keys.keys])
        position_score = keys.position_score(query_v, position_keys)                  # BD
        # Softmax in float32 whatever the compute dtype: the mask value below is representable,
        # and bf16/fp16 logits lose too much precision in exp/normalise.
        score = ops.cast(content_score + position_score, "float32") * self.scale
        score = ops.where(mask, score, -1e30)
        if score.shape[-1] == 1:  # one key (M = 0, T = 1): probability 1, and no Keras warning
            probs = ops.ones_like(score, dtype=query.dtype)  # about a softmax over one element
        else:
            probs = ops.cast(ops.softmax(score, axis=-1), query.dtype)
        probs = self.attention_dropout(probs, training=training)
        contexts, start = [], 0
        for v in keys.values:
            length = _dims(v)[2]
            part = probs if len(keys.values) == 1 else probs[..., start:start + length]
            contexts.append(ops.einsum("bntk,bnkh->btnh", part, v))
            start += length
        return functools.reduce(ops.add, contexts)

    def call(self, hidden, memory, position_keys, mask, content_bias, position_bias,
             training=None):
        """See the class docstring."""
        memory = as_layer_view(memory)
        segment = self.normalized(hidden)
        query = ops.transpose(_project(segment, self.query_kernel), (0, 2, 1, 3))  # [B, N, T, H]
        keys = memory.attend(self, segment)
        context = self.compute_attention(query, keys, position_keys, mask, content_bias,
                                         position_bias, training)
        n, h = self.n_head, self.d_head
        output = _project(ops.reshape(context, (*_dims(context)[:2], n * h)),
                          ops.reshape(self.output_kernel, (n * h, self.d_model)))
        output = self.output_dropout(output, training=training)
        output = hidden + output if self.pre_lnorm else self.layer_norm(hidden + output)
        return output, keys.written

    def compute_output_spec(self, hidden, memory=None, *args, **kwargs):
        written = as_layer_view(memory).written_spec(hidden, self.n_head, self.d_head,
                                                       self.compute_dtype)
        return keras.KerasTensor(hidden.shape, self.compute_dtype), written

    def get_config(self):
        return {
            **super().get_config(),
            "d_model": self.d_model, "n_head": self.n_head, "d_head": self.d_head,
            "dropout": self.dropout, "dropatt": self.dropatt, "pre_lnorm": self.pre_lnorm,
            "init_std": self.init_std, "layer_norm_epsilon": self.layer_norm_epsilon,
        }
