"""The key/value ring (loops of equal segments) and its per-layer view: fixed buffers the
segments are written into, with the position scores and the mask rolled to the ring's order.

Shape glossary: B batch, L layers, M memory length, T segment length, S ring slots, D model
size, N heads, H head size.
"""

import functools
from typing import Any, NamedTuple, Tuple

from keras import ops

from tfxl.layers.memory.key_value import KeyValueMemory
from tfxl.layers.memory.protocol import AttendedKeys, key_value_spec
from tfxl.layers.memory.slots import attention_mask, held, next_valid, reset_rows


def _length(tensor, axis):
    return tensor.shape[axis] if tensor.shape[axis] is not None else ops.shape(tensor)[axis]


def cyclic_position_score(attention, query, position_keys, segment_start, key_len):
    """`attention.position_score` for K = `key_len` keys in a cyclic buffer, the segment's T rows
    from slot `segment_start` and the older keys before it wrapping around: the oldest-first
    scores rolled by segment_start + T.

    Position keys for fewer than K distances (a ring's S slots exceed the M + T distances a query
    sees) get zero columns in front: distances only masked slots have.
    """
    distances = position_keys.shape[-1]
    if isinstance(key_len, int) and distances is not None and key_len > distances - 1:
        position_keys = ops.pad(position_keys, [[0, 0]] * (len(position_keys.shape) - 1)
                                + [[key_len - distances + 1, 0]])
    score = attention.position_score(query, position_keys)
    return ops.roll(score, (segment_start + _length(query, 2)) % key_len, axis=-1)


def written_into(buffer_keys, buffer_values, slot, keys, values):
    """The buffers with rows `keys` [B, N, H, T] / `values` [B, N, T, H] written at `slot`
    (`ops.slice_update`: in place where the buffer is an XLA loop variable or a donated JAX
    buffer)."""
    zero = ops.zeros((), "int32")
    slot = ops.cast(slot, "int32")
    return (ops.slice_update(ops.cast(buffer_keys, keys.dtype), (zero, zero, zero, slot), keys),
            ops.slice_update(ops.cast(buffer_values, values.dtype), (zero, zero, slot, zero),
                             values))


class RingSlots(NamedTuple):
    """One layer's buffers of S slots; the segment's T rows are written at `slot` and the segment
    attends to all S (a `KeyValueRing` layer, a `PositionCache` layer)."""

    keys: Any    # [B, N, H, S]
    values: Any  # [B, N, S, H]
    slot: Any    # int32 scalar

    def attend(self, attention, segment):
        keys, values = written_into(self.keys, self.values, self.slot,
                                    *attention.key_value(segment))
        return AttendedKeys([keys], [values], functools.partial(self.position_score, attention),
                            (keys, values))

    def position_score(self, attention, query, position_keys):
        """Slot j at offset o = (j - slot) mod S holds segment row o (o < T) or the position
        S - o before the segment's first row: the oldest-first scores of S keys rolled by
        slot + T."""
        return cyclic_position_score(attention, query, position_keys, self.slot,
                                     self.values.shape[2])

    def kept(self, layer_input, written):
        """The buffers with the segment's rows in them."""
        return written

    def written_spec(self, hidden, n_head, d_head, dtype):
        return key_value_spec(hidden, n_head, d_head, dtype, self.values.shape[2])


class KeyValueRing(NamedTuple):
    """The key/value memory as fixed buffers that segments are written into in place: a ring.

    For loops that read segments of one length T (evaluation, whole-document scoring): each layer
    keeps S slots of keys and values; a segment's T new rows are written over the T oldest slots
    and the segment attends to all S slots, each at its own distance. The `KeyValueMemory`
    instead appends the T rows and keeps the last M (a concatenation and a slice: two copies of
    every layer's memory per segment, which at M in the thousands cost as much as the segment's
    attention; BENCHMARKS.md, "Evaluation paths", compares the two).

    keys:      L × [B, N, H, S]  (as KeyValueMemory's, in ring order)
    values:    L × [B, N, S, H]
    valid:     [B, M] bool       the last M positions, oldest first (as KeyValueMemory's: small,
                                 so it is kept in order and gives M statically)
    next_slot: int32 scalar      p, where the next segment's first row goes (a multiple of T)

    With the segment written at slots [p, p + T), slot j at offset o = (j - p) mod S holds segment
    row o (o < T) or the memory position M - S + o (o >= T; one of the last M when that is >= 0,
    else one of the S - M - T older slots, which are never attended to). S is a multiple of T >=
    M + T (`ring_size`) so that no write wraps around. Only `from_memory` and the model write a
    ring, and `from_memory` zeroes the invalid slots' values: a ring is not cleaned again per call
    (which would copy it), as a `KeyValueMemory` is (`with_invalid_slots_zeroed`).
    """

    keys: Tuple[Any, ...]
    values: Tuple[Any, ...]
    valid: Any
    next_slot: Any

    @staticmethod
    def ring_size(mem_len, segment_len):
        """S: the smallest multiple of T that holds M + T slots."""
        return -(-(mem_len + segment_len) // segment_len) * segment_len

    @classmethod
    def empty(cls, batch_size, n_layer, mem_len, segment_len, n_head, d_head, dtype="float32"):
        """No valid slot, for segments of `segment_len` rows."""
        size = cls.ring_size(mem_len, segment_len)
        keys = ops.zeros((batch_size, n_head, d_head, size), dtype=dtype)
        values = ops.zeros((batch_size, n_head, size, d_head), dtype=dtype)
        return cls((keys,) * n_layer, (values,) * n_layer,
                   ops.zeros((batch_size, mem_len), dtype="bool"), ops.zeros((), "int32"))

    @classmethod
    def from_memory(cls, memory, segment_len):
        """The ring holding a `KeyValueMemory` (invalid slots' values zeroed), for segments of
        `segment_len` rows: the M slots go last, the first segment is written at slot 0."""
        memory = memory.with_invalid_slots_zeroed()
        pad = cls.ring_size(memory.mem_len, segment_len) - memory.mem_len

        def padded(tensor, axis):
            zeros = ops.zeros_like(tensor[(slice(None),) * axis + (slice(0, 1),)])
            return ops.concatenate([ops.repeat(zeros, pad, axis=axis), tensor], axis=axis)
        return cls(tuple(padded(k, 3) for k in memory.keys),
                   tuple(padded(v, 2) for v in memory.values), memory.valid,
                   ops.zeros((), "int32"))

    @property
    def mem_len(self):
        return self.valid.shape[1]

    @property
    def size(self):
        return self.values[0].shape[2]

    def key_length(self, segment_len):
        """M + T: the distances a query can see (the S - M - T spare slots are never seen; their
        position keys are zero: `cyclic_position_score`)."""
        self.check_segment_len(segment_len)
        return self.mem_len + segment_len

    def check_segment_len(self, segment_len):
        """Raises ValueError unless segments of `segment_len` rows fit this ring."""
        if self.size % segment_len or self.size < self.mem_len + segment_len:
            raise ValueError(
                f"a KeyValueRing of {self.size} slots and M = {self.mem_len} takes segments of "
                f"{self.size - self.mem_len} tokens or a divisor of {self.size} that leaves M + T "
                f"<= {self.size}; got T = {segment_len}")

    def layer(self, index):
        return RingSlots(self.keys[index], self.values[index], self.next_slot)

    def reset(self, reset):
        return self._replace(valid=reset_rows(self.valid, reset))

    def with_invalid_slots_zeroed(self):
        """The ring itself (see the class docstring: `from_memory` cleaned it)."""
        return self

    def attention_mask(self, segment_len, same_length=False, segment_valid=None):
        """[B, 1, T, S] bool: `attention_mask`'s rule, in ring order.

        Built oldest first, as `attention_mask` builds it for a memory of S - T slots whose
        first S - M - T are never valid, and rolled to ring order as the position scores are
        (slot j holds oldest-first slot (j - p - T) mod S). A roll fuses into the softmax's
        input as index arithmetic; a gather of each slot's validity did not (XLA recomputed it
        for every score).
        """
        self.check_segment_len(segment_len)
        mem_len, size = self.mem_len, self.size
        spare = ops.zeros((ops.shape(self.valid)[0], size - mem_len - segment_len), "bool")
        mask = attention_mask(ops.concatenate([spare, ops.cast(self.valid, "bool")], axis=1),
                              segment_len, False, segment_valid)
        if same_length:  # every query sees M + 1 positions: key j >= i + S - T - M
            query = ops.arange(segment_len)[:, None]
            mask = ops.logical_and(mask, ops.arange(size)[None, :] >= query + size - segment_len
                                   - mem_len)
        return ops.roll(mask, (self.next_slot + segment_len) % size, axis=-1)

    def updated(self, kept, segment_len, segment_valid=None, stop_gradient=True):
        """After a segment of T rows: the layers' rings (`kept`, the segment's rows in them), the
        mask moved on, the next slot."""
        return KeyValueRing(tuple(held(k, stop_gradient) for k, _ in kept),
                            tuple(held(v, stop_gradient) for _, v in kept),
                            next_valid(self.valid, segment_len, segment_valid),
                            (self.next_slot + segment_len) % self.size)

    def to_memory(self):
        """The `KeyValueMemory` of the last M positions, oldest first (one gather per tensor)."""
        slots = (self.next_slot - self.mem_len + ops.arange(self.mem_len, dtype="int32")) % (
            self.size)
        return KeyValueMemory(tuple(ops.take(k, slots, axis=3) for k in self.keys),
                              tuple(ops.take(v, slots, axis=2) for v in self.values), self.valid)
