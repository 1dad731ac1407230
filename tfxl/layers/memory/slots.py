"""A memory's slots and their valid mask: which keys each query sees (`attention_mask`, for keys
oldest first), the last M slots after a segment, rows reset, invalid slots zeroed.

Shape glossary: B batch, M memory slots, T segment length, K = M + T keys.
"""

from keras import ops


def attention_mask(memory_valid, segment_len, same_length=False, segment_valid=None):
    """Which keys each query may attend to: [B, 1, T, K] bool (True = attend), keys oldest first
    with the segment's T rows last.

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


def zero_invalid(tensor, valid_index):
    """`tensor` with zeros where the broadcast `valid_index` is False."""
    return ops.where(valid_index, tensor, ops.zeros((), tensor.dtype))


def last_slots(old, new, axis):
    """The last old.shape[axis] slots of [old; new] along `axis`, with the static shape restated
    (a segment of unknown length T makes the slice's shape unknown; loops and XLA need it)."""
    mem_len = old.shape[axis]
    if not mem_len:
        return old
    window = ops.concatenate([old, ops.cast(new, old.dtype)], axis=axis)
    window = window[(slice(None),) * axis + (slice(-mem_len, None),)]
    return ops.reshape(window, (-1,) + tuple(old.shape[1:]))


def next_valid(valid, segment_len, segment_valid):
    """valid [B, M] after a segment of `segment_len` rows (`segment_valid` [B, T]: which are
    real tokens, default all)."""
    if segment_valid is None:
        segment_valid = ops.ones((ops.shape(valid)[0], segment_len), dtype="bool")
    return last_slots(valid, ops.cast(segment_valid, "bool"), axis=1)


def reset_rows(valid, reset):
    """valid [B, M] with the rows where `reset` [B] is true emptied."""
    if reset is None:
        return valid
    keep = ops.logical_not(ops.cast(reset, "bool"))[:, None]
    return ops.logical_and(ops.cast(valid, "bool"), keep)


def held(tensor, stop_gradient):
    """`tensor` as a memory keeps it: without gradient unless `stop_gradient` is False."""
    return ops.stop_gradient(tensor) if stop_gradient else tensor
