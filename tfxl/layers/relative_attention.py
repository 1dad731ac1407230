"""Relative multi-head attention of Transformer-XL (Dai et al. 2019, section 3.3).

Shape glossary: B batch, T query (segment) length, M memory length, K = M + T key length,
D model size, N heads, H head size.

For query i (absolute key position M + i) and key j, with R the sinusoidal encoding of the distance
M + i - j, the score is
    (q_i + u) . k_j            terms (a) + (c): content, computed as one einsum "AC"
  + (q_i + v) . W_k,R R_{M+i-j} terms (b) + (d): position, computed as one einsum "BD"
scaled by 1/sqrt(H). Queries come from the current segment only; keys and values from
[memory; segment] (the memory arrives already stop-gradient).
"""

import math

import keras
from keras import ops

from tfxl.layers.dropout import HashDropout


def rel_shift(x):
    """Aligns position scores to relative distances: out[..., i, j] = x[..., i, j + T - 1 - i].

    `x` is [..., T, K] where column m holds the score against the encoding of distance K - 1 - m.
    Query i and key j are at distance (M + i) - j, i.e. column m = T - 1 - i + j, which is what the
    identity above reads. The trick: pad one zero column in front ([T, K + 1]), view the same
    row-major buffer as [K + 1, T], drop the first row, and view the rest as [T, K]. Element (i, j) of
    the result is element T + i*K + j of the padded buffer = row i, column j + T - i of the padded
    matrix = x[i, j + T - 1 - i]. Entries with j > M + i read past the row; they are junk that the
    causal mask always hides.
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


def _project(x, kernel):
    """x [..., D] times kernel [D, *out] as one 2-D matmul -> [..., *out]."""
    x_dims, k_dims = _dims(x), list(kernel.shape)
    out = ops.matmul(ops.reshape(x, (-1, x_dims[-1])), ops.reshape(kernel, (k_dims[0], -1)))
    return ops.reshape(out, (*x_dims[:-1], *k_dims[1:]))


@keras.saving.register_keras_serializable(package="tfxl")
class RelativeMultiHeadAttention(keras.layers.Layer):
    """Relative multi-head attention with residual connection and LayerNorm.

    Args:
      d_model: D. n_head: N. d_head: H.
      dropout: rate on the attention output (before the residual).
      dropatt: rate on the attention probabilities.
      pre_lnorm: normalise the input (memory included) before attention and add the residual
        without a final LayerNorm; default is post-LN: LayerNorm(input + attention).
      init_std: std of the normal initialiser of the projections.

    Call args:
      hidden: [B, T, D] the current segment.
      memory_state: [B, M, D] this layer's memory (may have M = 0).
      position_encoding: [K, D] sinusoidal R for distances K-1 ... 0.
      mask: [B, 1, T, K] bool, True where the query may attend to the key.
      content_bias: u, [N, H]. position_bias: v, [N, H].
    Returns:
      [B, T, D].
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
        init = keras.initializers.RandomNormal(stddev=self.init_std)
        heads = (self.d_model, self.n_head, self.d_head)
        # W_q, W_k,E, W_v act on token states; W_k,R acts on position encodings only (no bias, as
        # the reference code).
        self.query_kernel = self.add_weight(name="query_kernel", shape=heads, initializer=init)
        self.key_kernel = self.add_weight(name="key_kernel", shape=heads, initializer=init)
        self.value_kernel = self.add_weight(name="value_kernel", shape=heads, initializer=init)
        self.position_kernel = self.add_weight(name="position_kernel", shape=heads,
                                               initializer=init)
        self.output_kernel = self.add_weight(
            name="output_kernel", shape=(self.n_head, self.d_head, self.d_model), initializer=init)
        self.layer_norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, name="layer_norm", dtype=self.dtype_policy)
        self.layer_norm.build(hidden_shape)
        self.attention_dropout = HashDropout(self.dropatt, name="attention_dropout")
        self.output_dropout = HashDropout(self.dropout, name="output_dropout")

    def call(self, hidden, memory_state, position_encoding, mask, content_bias, position_bias,
             training=None):
        segment = self.layer_norm(hidden) if self.pre_lnorm else hidden
        memory = self.layer_norm(memory_state) if self.pre_lnorm else memory_state
        keys_in = ops.concatenate([ops.cast(memory, segment.dtype), segment], axis=1)  # [B, K, D]
        n, h = self.n_head, self.d_head

        # Projections as plain 2-D matmuls ([rows, D] x [D, N*H]): their weight gradients are one
        # GEMM instead of a per-batch batched matmul plus a reduction (what einsum's gradient
        # builds), and k and v share one GEMM over the K rows. q is projected for the T segment
        # rows only (memory rows are keys/values, never queries).
        query = _project(segment, self.query_kernel)                          # [B, T, N, H]
        kv_kernel = ops.concatenate([ops.reshape(self.key_kernel, (self.d_model, n * h)),
                                     ops.reshape(self.value_kernel, (self.d_model, n * h))],
                                    axis=-1)
        key_value = _project(keys_in, ops.reshape(kv_kernel, (self.d_model, 2 * n, h)))
        key, value = ops.split(key_value, 2, axis=2)  # [B, K, N, H] each (split: cheap gradient)
        # One zero encoding row in front ([K + 1, D]): the position scores then come out with
        # the zero column that rel_shift needs, so no padded copy of [B, N, T, K] is made.
        position_encoding = ops.pad(position_encoding, [[1, 0], [0, 0]])
        position = _project(position_encoding, self.position_kernel)          # [K + 1, N, H]

        content_score = ops.einsum("btnh,bknh->bntk", query + content_bias, key)        # AC
        position_score = rel_shift_prepadded(
            ops.einsum("btnh,knh->bntk", query + position_bias, position))              # BD
        # Softmax in float32 whatever the compute dtype: the mask value below is representable,
        # and bf16/fp16 logits lose too much precision in exp/normalise.
        score = ops.cast(content_score + position_score, "float32") * self.scale
        score = ops.where(mask, score, -1e30)
        probs = ops.cast(ops.softmax(score, axis=-1), segment.dtype)
        probs = self.attention_dropout(probs, training=training)

        context = ops.einsum("bntk,bknh->btnh", probs, value)
        output = _project(ops.reshape(context, (*_dims(context)[:2], n * h)),
                          ops.reshape(self.output_kernel, (n * h, self.d_model)))
        output = self.output_dropout(output, training=training)
        if self.pre_lnorm:
            return hidden + output
        return self.layer_norm(hidden + output)

    def compute_output_shape(self, hidden_shape, *args, **kwargs):
        return hidden_shape

    def get_config(self):
        return {
            **super().get_config(),
            "d_model": self.d_model, "n_head": self.n_head, "d_head": self.d_head,
            "dropout": self.dropout, "dropatt": self.dropatt, "pre_lnorm": self.pre_lnorm,
            "init_std": self.init_std, "layer_norm_epsilon": self.layer_norm_epsilon,
        }
