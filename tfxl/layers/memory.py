"""Transformer-XL memory: cached layer inputs with a validity mask (Dai et al. 2019, section 3.2).

Shape glossary: B batch (streams), L layers, M memory length, T segment length, K = M + T keys,
D model size.

A memory is a dict with two tensors:
  "states": [B, L, M, D]  the input of layer l at the last M positions (layer 0: scaled embeddings).
  "valid":  [B, M] bool   which of those M slots hold a real token.

Shapes are static (M is fixed) so steps compile once under XLA/TPU; the mask keeps the semantics
exact: a fresh or reset memory has no valid slot and is never attended to (the original TF code
attends to zero-filled slots after a reset). Memory never carries gradients.
"""

from keras import ops

STATES = "states"
VALID = "valid"


def empty_memory(batch_size, n_layer, mem_len, d_model, dtype="float32"):
    """A memory with no valid slot: [B, L, M, D] zeros and an all-False [B, M] mask."""
    return {
        STATES: ops.zeros((batch_size, n_layer, mem_len, d_model), dtype=dtype),
        VALID: ops.zeros((batch_size, mem_len), dtype="bool"),
    }


def reset_rows(memory, reset):
    """Invalidates the memory of rows where `reset` [B] is true (a new stream or document begins)."""
    if reset is None:
        return memory
    keep = ops.logical_not(ops.cast(reset, "bool"))[:, None]
    return {STATES: memory[STATES], VALID: ops.logical_and(memory[VALID], keep)}


def updated_memory(memory, layer_inputs, segment_valid=None):
    """The next memory: last M positions of [old memory; this segment], stop-gradient.

    Args:
      memory: the memory the segment attended to ("states" [B, L, M, D], "valid" [B, M]).
      layer_inputs: list of L tensors [B, T, D], the input of each layer for this segment.
      segment_valid: optional bool [B, T], False at padding tokens, which are never remembered.
    Returns:
      A memory of the same shapes. M may be smaller than, equal to or larger than T.
    """
    states, valid = memory[STATES], memory[VALID]
    mem_len = states.shape[2]
    current = ops.stack(layer_inputs, axis=1)  # [B, L, T, D]
    current = ops.cast(current, states.dtype)
    new_states = ops.concatenate([states, current], axis=2)[:, :, -mem_len:] if mem_len else states
    if segment_valid is None:
        segment_valid = ops.ones_like(current[:, 0, :, 0], dtype="bool")
    new_valid = ops.concatenate([valid, segment_valid], axis=1)[:, -mem_len:] if mem_len else valid
    # Re-state the static shapes (a segment of unknown length T makes the slices' shapes unknown);
    # loops (generation) and XLA need them.
    new_states = ops.reshape(new_states, (-1,) + tuple(states.shape[1:]))
    new_valid = ops.reshape(new_valid, (-1, mem_len))
    return {STATES: ops.stop_gradient(new_states), VALID: new_valid}


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
