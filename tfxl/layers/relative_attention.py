"""Relative multi-head attention of Transformer-XL (Dai et al. 2019, section 3.3).

Shape glossary: B batch, T query (segment) length, M memory length, K = M + T key length,
D model size, N heads, H head size.

For query i (absolute key position M + i) and key j, with R the sinusoidal encoding of the distance
M + i - j, the score is
    (q_i + u) . k_j            terms (a) + (c): content, one einsum "AC"
  + (q_i + v) . W_k,R R_{M+i-j} terms (b) + (d): position, one einsum "BD" (`position_score`)
scaled by 1/sqrt(H). Queries come from the current segment only; keys and values from
[memory; segment] (the memory arrives already stop-gradient).

Two kinds of memory reach the layer (see `tfxl.layers.memory`): layer inputs [B, M, D], whose
keys and values are projected here with the segment's (training: W_k and W_v learn through the
memory rows), or keys and values already projected, keys [B, N, H, M] and values [B, N, M, H]
(inference: only the T new rows are projected). Both meet in one attention core, so the two paths
cannot drift apart.
"""

import functools
import math

import keras
from keras import ops

from tfxl.layers.dropout import HashDropout


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


def _project(x, kernel):
    """x [..., D] times kernel [D, *out] as one 2-D matmul -> [..., *out], in x's dtype (outside
    a layer call, e.g. precomputing position keys, Keras does not autocast the kernel)."""
    x_dims, k_dims = _dims(x), list(kernel.shape)
    kernel = ops.cast(kernel, x.dtype)
    out = ops.matmul(ops.reshape(x, (-1, x_dims[-1])), ops.reshape(kernel, (k_dims[0], -1)))
    return ops.reshape(out, (*x_dims[:-1], *k_dims[1:]))


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
      memory: this layer's memory, either its layer inputs [B, M, D] (may have M = 0) or a pair
        (keys [B, N, H, M], values [B, N, M, H]) from `project_memory` or earlier calls' outputs.
      position_keys: `project_positions(R)` for the K = M + T distances of this call; inference
        computes it once per pass and reuses it for every segment of that shape.
      mask: [B, 1, T, K] bool, True where the query may attend to the key.
      content_bias: u, [N, H]. position_bias: v, [N, H].
    Returns:
      (output [B, T, D], (keys [B, N, H, T], values [B, N, T, H]) of the segment's own rows): what
      a key/value memory appends.
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
        # Sublayers take this layer's dtype policy: under a mixed policy given to this layer
        # alone, a float32 sublayer would cast its input back to float32.
        policy = self.dtype_policy
        self.layer_norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, name="layer_norm", dtype=policy)
        self.layer_norm.build(hidden_shape)
        self.attention_dropout = HashDropout(self.dropatt, name="attention_dropout", dtype=policy)
        self.output_dropout = HashDropout(self.dropout, name="output_dropout", dtype=policy)

    # -- projections --------------------------------------------------------------------------
    def _key_value(self, rows):
        """Keys and values of normalised rows [B, R, D]: [B, N, R, H] each, from one GEMM.

        Plain 2-D matmuls ([rows, D] x [D, 2*N*H]): their weight gradients are one GEMM instead
        of a batched matmul plus a reduction (what einsum's gradient builds).
        """
        n, h = self.n_head, self.d_head
        kernel = ops.concatenate([ops.reshape(self.key_kernel, (self.d_model, n * h)),
                                  ops.reshape(self.value_kernel, (self.d_model, n * h))], axis=-1)
        key_value = _project(rows, ops.reshape(kernel, (self.d_model, 2 * n, h)))
        key_value = ops.transpose(key_value, (0, 2, 1, 3))  # [B, 2N, R, H], heads-major
        return ops.split(key_value, 2, axis=1)  # (split: a cheap gradient)

    def project_memory(self, memory_state):
        """Keys [B, N, H, M] and values [B, N, M, H] of a layer-input memory [B, M, D]: what
        inference caches."""
        memory_state = ops.cast(memory_state, self.compute_dtype)
        keys, values = self._key_value(
            self.layer_norm(memory_state) if self.pre_lnorm else memory_state)
        return ops.transpose(keys, (0, 1, 3, 2)), values

    def project_positions(self, position_encoding):
        """W_k,R R: position keys [N, H, K + 1] for R [K, D] (distances K-1 ... 0).

        Depends on K, clamp_len and the weights only. Column 0 is the projection of an all-zero
        encoding, so `position_score` comes out with the zero column rel_shift needs and no
        padded copy of [B, N, T, K] is made; each head's [H, K + 1] matrix is read in place.
        """
        position_encoding = ops.pad(ops.cast(position_encoding, self.compute_dtype),
                                    [[1, 0], [0, 0]])
        return ops.transpose(_project(position_encoding, self.position_kernel), (1, 2, 0))

    def position_score(self, query, position_keys, key_distance=None):
        """Terms (b) + (d): (q_i + v) . W_k,R R_{M+i-j} for every query i and key j.

        query: q + v, [B, N, T, H]. position_keys: [N, H, K + 1]. Returns [B, N, T, K].
        key_distance: optional int [K], each key's distance from a single query (T = 1) whose
          keys are not stored oldest-first (a decode cache kept in parts); read by column.
        """
        score = ops.einsum("bnth,nhk->bntk", query, position_keys)  # column m: distance K - m
        if key_distance is None:
            return rel_shift_prepadded(score)
        key_len = position_keys.shape[2] - 1
        return ops.take(score, key_len - ops.clip(key_distance, 0, key_len - 1), axis=-1)

    def _ring_position_score(self, query, position_keys, write_slot, size):
        """BD in ring order [B, N, T, S], from `position_score` over S keys stored oldest first.

        Oldest first, the S slots would be those of a memory of S - T and the segment; with the
        segment written at slots [p, p + T), slot j holds what oldest-first slot (j - p - T) mod
        S holds, so the scores are rolled by p + T (one pass, where a gather of every score by
        its distance costs twice as much under XLA on CPU). The position keys of K = M + T get
        S - K zero columns in front: distances >= K, which only the S - M - T spare slots have
        and the mask hides.
        """
        key_len = position_keys.shape[-1] - 1
        segment_len = _dims(query)[2]
        position_keys = ops.pad(position_keys, [[0, 0]] * (len(position_keys.shape) - 1)
                                + [[size - key_len, 0]])
        return ops.roll(self.position_score(query, position_keys),
                        (write_slot + segment_len) % size, axis=-1)

    # -- attention ----------------------------------------------------------------------------
    def call(self, hidden, memory, position_keys, mask, content_bias, position_bias,
             training=None, key_distance=None, write_slot=None):
        """See the class docstring; `memory` may also be a list of (keys, values) parts whose
        keys, with the segment's, are listed in `key_distance` order (see `position_score`).

        write_slot: with a (keys [B, N, H, S], values [B, N, S, H]) ring (a `KeyValueRing`
          layer), the slot where the segment's rows are written, in place of the T oldest; the
          segment then attends to the S slots (`mask` [B, 1, T, S] in ring order), and the
          rings with its rows are returned in place of the rows.
        """
        segment = self.layer_norm(hidden) if self.pre_lnorm else hidden
        query = ops.transpose(_project(segment, self.query_kernel), (0, 2, 1, 3))  # [B, N, T, H]
        query_u = query + ops.cast(content_bias, query.dtype)[:, None, :]  # u: [N, 1, H]
        if write_slot is not None:  # key/value ring: write the T new rows, attend to the S slots
            segment_keys, segment_values = self._key_value(segment)
            ring_keys, ring_values = memory
            segment_keys = ops.slice_update(  # [B, N, H, S]
                ops.cast(ring_keys, query.dtype), (0, 0, 0, write_slot),
                ops.transpose(segment_keys, (0, 1, 3, 2)))
            segment_values = ops.slice_update(  # [B, N, S, H]
                ops.cast(ring_values, query.dtype), (0, 0, write_slot, 0), segment_values)
            value_parts = [segment_values]
            content_score = ops.einsum("bnth,bnhk->bntk", query_u, segment_keys)          # AC
        elif isinstance(memory, (tuple, list)):  # key/value memory: project the T new rows only
            segment_keys, segment_values = self._key_value(segment)
            segment_keys = ops.transpose(segment_keys, (0, 1, 3, 2))  # [B, N, H, T]
            # Memory parts and segment stay separate tensors (scores concatenated instead):
            # copying the M cached rows every step would cost more than attending to them.
            parts = memory if isinstance(memory[0], (tuple, list)) else [memory]
            key_parts = [ops.cast(k, query.dtype) for k, _ in parts] + [segment_keys]
            value_parts = [ops.cast(v, query.dtype) for _, v in parts] + [segment_values]
            content_score = ops.concatenate(                                             # AC
                [ops.einsum("bnth,bnhk->bntk", query_u, k) for k in key_parts], -1)
        else:  # layer-input memory: k and v of all K rows in one GEMM
            memory = ops.cast(memory, hidden.dtype)
            memory_rows = self.layer_norm(memory) if self.pre_lnorm else memory
            keys, values = self._key_value(ops.concatenate([memory_rows, segment], axis=1))
            mem_len = memory.shape[1]
            segment_keys = ops.transpose(keys[:, :, mem_len:], (0, 1, 3, 2))
            segment_values = values[:, :, mem_len:]
            value_parts = [values]
            content_score = ops.einsum("bnth,bnkh->bntk", query_u, keys)                  # AC
        position_bias = ops.cast(position_bias, query.dtype)[:, None, :]

        if write_slot is None:
            position_score = self.position_score(query + position_bias, position_keys,  # BD
                                                 key_distance)
        else:
            position_score = self._ring_position_score(query + position_bias, position_keys,
                                                       write_slot, value_parts[0].shape[2])
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
        for v in value_parts:
            length = v.shape[2] if v.shape[2] is not None else ops.shape(v)[2]
            contexts.append(ops.einsum("bntk,bnkh->btnh", probs[..., start:start + length], v))
            start += length
        context = functools.reduce(ops.add, contexts)
        n, h = self.n_head, self.d_head
        output = _project(ops.reshape(context, (*_dims(context)[:2], n * h)),
                          ops.reshape(self.output_kernel, (n * h, self.d_model)))
        output = self.output_dropout(output, training=training)
        output = hidden + output if self.pre_lnorm else self.layer_norm(hidden + output)
        return output, (segment_keys, segment_values)

    def compute_output_spec(self, hidden, memory=None, *args, write_slot=None, **kwargs):
        batch, seg_len, dtype = hidden.shape[0], hidden.shape[1], self.compute_dtype
        if write_slot is not None:  # the rings
            seg_len = memory[1].shape[2]
        keys = keras.KerasTensor((batch, self.n_head, self.d_head, seg_len), dtype)
        values = keras.KerasTensor((batch, self.n_head, seg_len, self.d_head), dtype)
        return keras.KerasTensor(hidden.shape, dtype), (keys, values)

    def get_config(self):
        return {
            **super().get_config(),
            "d_model": self.d_model, "n_head": self.n_head, "d_head": self.d_head,
            "dropout": self.dropout, "dropatt": self.dropatt, "pre_lnorm": self.pre_lnorm,
            "init_std": self.init_std, "layer_norm_epsilon": self.layer_norm_epsilon,
        }
