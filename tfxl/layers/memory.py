"""Transformer-XL memory: what each layer remembers of the last M positions (Dai et al. 2019, 3.2).

Shape glossary: B batch (streams), L layers, M memory length, T segment length, K = M + T keys,
D model size, N heads, H head size.

A memory is a dict of tensors of one of two kinds; the model accepts either and returns the kind
it was given.

Layer-input memory (training; the paper's): 4·L·M·D bytes per row in float32.
  "states": [B, L, M, D]     the input of layer l at the last M positions (layer 0: embeddings).
  "valid":  [B, M] bool      which of those M slots hold a real token.
  Training needs it: W_k and W_v receive gradients through the memory rows they project.

Key/value memory (evaluation, generation, serving): 2·N·H/D times the layer-input memory.
  "keys":   [B, L, N, H, M]  layer l's keys of the last M positions (W_k,E applied, after the
                             pre-LN LayerNorm where pre_lnorm), stored as each head's [H, M]
                             matrix so that q . k is a plain matmul reading them in place (a
                             transposed operand is packed into a fresh copy first).
  "values": [B, L, N, M, H]  the same through W_v, each head's [M, H] matrix (probs . v reads it
                             in place).
  "valid":  [B, M] bool      as above.
  With fixed weights it holds exactly what the layer-input memory would be projected to, so a
  segment step projects only its T new rows (`TransfoXLBackbone.key_value_memory` converts).

Shapes are static (M is fixed) so steps compile once under XLA/TPU; the mask keeps the semantics
exact: a fresh or reset memory has no valid slot and is never attended to (the original TF code
attends to zero-filled slots after a reset). Memory carries no gradient (the paper's truncated
backpropagation), except where a caller asks for it: `updated_memory(..., stop_gradient=False)`,
which document classification uses inside its window of segments read with gradient
(`tfxl.classification`).
"""

from keras import ops

STATES = "states"
KEYS = "keys"
VALUES = "values"
VALID = "valid"


def is_key_value_memory(memory):
    """True for a key/value memory, False for a layer-input memory."""
    return KEYS in memory


def empty_memory(batch_size, n_layer, mem_len, d_model, dtype="float32"):
    """A layer-input memory with no valid slot: [B, L, M, D] zeros and an all-False [B, M] mask."""
    return {
        STATES: ops.zeros((batch_size, n_layer, mem_len, d_model), dtype=dtype),
        VALID: ops.zeros((batch_size, mem_len), dtype="bool"),
    }


def empty_key_value_memory(batch_size, n_layer, mem_len, n_head, d_head, dtype="float32"):
    """A key/value memory with no valid slot: keys [B, L, N, H, M], values [B, L, N, M, H],
    valid [B, M]."""
    return {KEYS: ops.zeros((batch_size, n_layer, n_head, d_head, mem_len), dtype=dtype),
            VALUES: ops.zeros((batch_size, n_layer, n_head, mem_len, d_head), dtype=dtype),
            VALID: ops.zeros((batch_size, mem_len), dtype="bool")}


def reset_rows(memory, reset):
    """Invalidates the memory of rows where `reset` [B] is true (a new stream or document
    begins)."""
    if reset is None:
        return memory
    keep = ops.logical_not(ops.cast(reset, "bool"))[:, None]
    return {**memory, VALID: ops.logical_and(memory[VALID], keep)}


def with_invalid_slots_zeroed(memory):
    """The memory with zeros in the values (or layer inputs) of its invalid slots.

    Why: a masked key's attention probability is exactly 0, but 0 x NaN = NaN, and a slot marked
    invalid may hold anything (a client's NaN or Inf). Keys need nothing (their scores are
    replaced by the mask). The model applies this once per call, where a memory enters, not in
    the attention: per layer it would copy the memory again on every generated token; and every
    memory the model returns is built from the cleaned one, so loops stay clean.
    """
    valid = ops.cast(memory[VALID], "bool")
    if STATES in memory:  # [B, L, M, D]
        states = memory[STATES]
        return {**memory, STATES: ops.where(valid[:, None, :, None], states,
                                            ops.zeros((), states.dtype))}
    values = memory[VALUES]
    if isinstance(values, (list, tuple)):  # per-layer [B, N, M, H]
        return {**memory, VALUES: [ops.where(valid[:, None, :, None], v, ops.zeros((), v.dtype))
                                   for v in values]}
    return {**memory, VALUES: ops.where(valid[:, None, None, :, None], values,
                                        ops.zeros((), values.dtype))}


def _last_slots(old, new, axis):
    """The last old.shape[axis] slots of [old; new] along `axis`, with the static shape restated
    (a segment of unknown length T makes the slice's shape unknown; loops and XLA need it)."""
    mem_len = old.shape[axis]
    if not mem_len:
        return old
    window = ops.concatenate([old, ops.cast(new, old.dtype)], axis=axis)
    window = window[(slice(None),) * axis + (slice(-mem_len, None),)]
    return ops.reshape(window, (-1,) + tuple(old.shape[1:]))


def _next_valid(valid, new_rows, segment_valid):
    if segment_valid is None:
        segment_valid = ops.ones_like(new_rows, dtype="bool")
    return _last_slots(valid, ops.cast(segment_valid, "bool"), axis=1)


def updated_memory(memory, layer_inputs, segment_valid=None, stop_gradient=True):
    """The next layer-input memory: last M positions of [old memory; this segment], stop-gradient
    unless `stop_gradient` is False (gradients then reach the segment through the next one).

    Args:
      memory: the memory the segment attended to ("states" [B, L, M, D], "valid" [B, M]).
      layer_inputs: list of L tensors [B, T, D], the input of each layer for this segment.
      segment_valid: optional bool [B, T], False at padding tokens, which are never remembered.
    Returns:
      A memory of the same shapes. M may be smaller than, equal to or larger than T.
    """
    current = ops.stack(layer_inputs, axis=1)  # [B, L, T, D]
    states = _last_slots(memory[STATES], current, axis=2)
    return {STATES: ops.stop_gradient(states) if stop_gradient else states,
            VALID: _next_valid(memory[VALID], current[:, 0, :, 0], segment_valid)}


def updated_key_value_memory(memory, segment_keys, segment_values, segment_valid=None):
    """The next key/value memory: last M positions of [old memory; this segment's k and v].

    segment_keys: lists of L tensors [B, N, H, T], segment_values: [B, N, T, H] (each layer's
    new rows). A memory in per-layer form (see `per_layer`) stays in that form.
    """
    valid = _next_valid(memory[VALID], segment_keys[0][:, 0, 0, :], segment_valid)
    if isinstance(memory[KEYS], (list, tuple)):
        return {KEYS: [ops.stop_gradient(_last_slots(old, new, axis=3))
                       for old, new in zip(memory[KEYS], segment_keys)],
                VALUES: [ops.stop_gradient(_last_slots(old, new, axis=2))
                         for old, new in zip(memory[VALUES], segment_values)],
                VALID: valid}
    keys, values = ops.stack(segment_keys, axis=1), ops.stack(segment_values, axis=1)
    return {KEYS: ops.stop_gradient(_last_slots(memory[KEYS], keys, axis=4)),
            VALUES: ops.stop_gradient(_last_slots(memory[VALUES], values, axis=3)),
            VALID: valid}


def layer_keys_values(memory, layer):
    """Layer `layer`'s (keys [B, N, H, M], values [B, N, M, H]) of a key/value memory in either
    form."""
    if isinstance(memory[KEYS], (list, tuple)):
        return memory[KEYS][layer], memory[VALUES][layer]
    return memory[KEYS][:, layer], memory[VALUES][:, layer]


def per_layer(memory):
    """A key/value memory with keys and values as lists of L per-layer tensors.

    Loops that carry the memory through many one-token steps (generation) use this form: slicing
    each layer out of [B, L, ...] and stacking the layers back are two copies of the whole memory
    per step, which at M in the thousands cost more than the step's attention.
    """
    n_layer = memory[KEYS].shape[1]
    return {KEYS: [memory[KEYS][:, i] for i in range(n_layer)],
            VALUES: [memory[VALUES][:, i] for i in range(n_layer)], VALID: memory[VALID]}


def stacked(memory):
    """The public form of a key/value memory: keys [B, L, N, H, M], values [B, L, N, M, H]."""
    if not isinstance(memory[KEYS], (list, tuple)):
        return memory
    return {KEYS: ops.stack(memory[KEYS], axis=1), VALUES: ops.stack(memory[VALUES], axis=1),
            VALID: memory[VALID]}


def attention_mask(memory_valid, segment_len, same_length=False, segment_valid=None):
    """Which keys each query may attend to: [B, 1, T, K] bool (True = attend).

    Query i sits at key position M + i. It sees key j when j <= M + i (causal over memory and
    segment) and the key is a real token (a valid memory slot, or a segment token that is not
    padding: `segment_valid` [B, T], default all True). With
    `same_length`, it also needs j >= i, so every query sees exactly M + 1 key positions, as the
    reference TF code does.
    """
    mem_len = memory_valid.shape[1]
    key_len = mem_len + segment_len
    query = ops.arange(segment_len)[:, None]
    key = ops.arange(key_len)[None, :]
    allowed = key <= query + mem_len
    if same_length:
        allowed = ops.logical_and(allowed, key >= query)
    if segment_valid is None:
        segment_valid = ops.ones((ops.shape(memory_valid)[0], segment_len), dtype="bool")
    key_valid = ops.concatenate(
        [ops.cast(memory_valid, "bool"), ops.cast(segment_valid, "bool")], axis=1)
    return ops.logical_and(allowed[None, None, :, :], key_valid[:, None, None, :])
