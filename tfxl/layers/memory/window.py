"""The recent-window memory (generation, one token a step) and its per-layer view.

Shape glossary: B batch, L layers, M memory length, W window slots, D model size, N heads,
H head size.
"""

import functools
from typing import Any, NamedTuple, Tuple

from keras import ops

from tfxl.layers.memory.key_value import KeyValueMemory
from tfxl.layers.memory.protocol import AttendedKeys, key_value_spec
from tfxl.layers.memory.ring import cyclic_position_score
from tfxl.layers.memory.slots import held, reset_rows


class WindowSlots(NamedTuple):
    """One layer of a `RecentWindowMemory`: the fixed memory's M slots, then W window slots the
    one-token segment is written into at `filled` (a select over W slots: small, no scatter)."""

    memory_keys: Any    # [B, N, H, M]
    memory_values: Any  # [B, N, M, H]
    keys: Any           # [B, N, H, W]
    values: Any         # [B, N, W, H]
    filled: Any         # int32 scalar r: the token's window slot

    def attend(self, attention, segment):
        token_keys, token_values = attention.key_value(segment)
        slot = ops.arange(self.values.shape[2], dtype="int32") == self.filled  # [W]
        keys = ops.where(slot, token_keys, ops.cast(self.keys, token_keys.dtype))
        values = ops.where(slot[:, None], token_values, ops.cast(self.values, token_values.dtype))
        return AttendedKeys([ops.cast(self.memory_keys, keys.dtype), keys],
                            [ops.cast(self.memory_values, values.dtype), values],
                            functools.partial(self.position_score, attention), (keys, values))

    def position_score(self, attention, query, position_keys):
        """The M + W slots as a cyclic buffer with the token at slot M + r: memory slot f is
        M - f + r positions back, window slot i r - i."""
        return cyclic_position_score(attention, query, position_keys,
                                     self.memory_values.shape[2] + self.filled,
                                     self.memory_values.shape[2] + self.values.shape[2])

    def kept(self, layer_input, written):
        """The window with the token's keys and values written."""
        return written

    def written_spec(self, hidden, n_head, d_head, dtype):
        return key_value_spec(hidden, n_head, d_head, dtype, self.values.shape[2])


class RecentWindowMemory(NamedTuple):
    """A key/value memory for one-token steps (generation): the memory of M slots stays fixed
    while the newest tokens are written into a window of W slots beside it.

    Why: appending one token to a [B, N, M, H] memory and dropping the oldest is a copy of the
    whole memory in every layer (tensors are immutable outside XLA's in-place updates); at M in
    the thousands that copy costs more than the token's attention. Here a step writes only the
    small window, attends to both (the oldest memory slots hidden as the window fills, so it
    always sees the last M positions), and every W tokens `merged_if_full` moves the window
    into the memory (one copy per W tokens).

    memory: the `KeyValueMemory` of the M positions before the window.
    keys, values: L × [B, N, H, W] / [B, N, W, H], the window.
    valid: [B, W] bool, the window slots written.
    filled: int32 scalar r, the window slots in use; the next token goes to slot r.
    The newest M positions are memory slots r..M-1 and window slots 0..r-1: memory slot f is at
    distance M - f + r from the token being read, window slot i at r - i.
    """

    memory: KeyValueMemory
    keys: Tuple[Any, ...]
    values: Tuple[Any, ...]
    valid: Any
    filled: Any

    @classmethod
    def from_memory(cls, memory, window):
        """An empty window of `window` slots beside a `KeyValueMemory`."""
        values = memory.values[0]
        empty = KeyValueMemory.empty(ops.shape(values)[0], len(memory.values), window,
                                     values.shape[1], values.shape[3], values.dtype)
        return cls(memory, empty.keys, empty.values, empty.valid,
                   ops.convert_to_tensor(0, "int32"))

    @property
    def mem_len(self):
        return self.memory.mem_len

    @property
    def window(self):
        return self.values[0].shape[2]

    def key_length(self, segment_len):
        """M + W: the slots attended (the largest distance is M + W - 1)."""
        if segment_len != 1:
            raise ValueError(f"a RecentWindowMemory reads one token per call; got {segment_len}")
        return self.mem_len + self.window

    def layer(self, index):
        return WindowSlots(self.memory.keys[index], self.memory.values[index], self.keys[index],
                           self.values[index], self.filled)

    def _distances(self):
        """Each of the M + W slots' distance from the token at window slot r."""
        mem_len, r = self.mem_len, self.filled
        return ops.concatenate([mem_len - ops.arange(mem_len, dtype="int32") + r,
                                r - ops.arange(self.window, dtype="int32")], axis=0)

    def attention_mask(self, segment_len, same_length=False, segment_valid=None):
        """[B, 1, 1, M + W]: a slot is seen when it holds a token within the last M positions,
        or is the token itself (`same_length` changes nothing for a single query)."""
        distance = self._distances()
        slot = ops.arange(self.window, dtype="int32") == self.filled
        written = ops.concatenate([ops.cast(self.memory.valid, "bool"),
                                   ops.logical_or(ops.cast(self.valid, "bool"), slot[None])], 1)
        seen = ops.logical_and(written, ((distance >= 0) & (distance <= self.mem_len))[None])
        if segment_valid is not None:
            own = ops.cast(segment_valid, "bool")  # [B, 1]: the token itself is padding
            seen = ops.logical_and(seen, ops.logical_or(distance[None] != 0, own))
        return seen[:, None, None, :]

    def reset(self, reset):
        return self._replace(memory=self.memory.reset(reset), valid=reset_rows(self.valid, reset))

    def with_invalid_slots_zeroed(self):
        """Itself: its memory was cleaned where it entered the model, and only the model writes
        the window."""
        return self

    def updated(self, kept, segment_len, segment_valid=None, stop_gradient=True):
        """The window with the token (in `kept`) at slot r, r + 1 slots in use."""
        slot = ops.arange(self.window, dtype="int32") == self.filled
        token_valid = (ops.ones_like(self.valid[:, :1]) if segment_valid is None
                       else ops.cast(segment_valid, "bool"))
        return RecentWindowMemory(
            self.memory, tuple(held(k, stop_gradient) for k, _ in kept),
            tuple(held(v, stop_gradient) for _, v in kept),
            ops.logical_or(ops.cast(self.valid, "bool"),
                           ops.logical_and(slot[None], token_valid)), self.filled + segment_len)

    def _joined(self, first):
        """The M slots [first, first + M) of [memory; window], as a `KeyValueMemory`."""
        def last_m(memory, window, axis):
            joined = ops.concatenate([memory, window], axis=axis)
            start = [0] * len(memory.shape)
            start[axis] = first
            # The memory's own shape: static but for a batch unknown while TensorFlow traces, so
            # a loop variable keeps its shape (tf.while_loop requires it).
            return ops.slice(joined, start, list(ops.shape(memory)))
        memory = self.memory
        if not self.mem_len:
            return memory
        return KeyValueMemory(
            tuple(last_m(m, w, 3) for m, w in zip(memory.keys, self.keys)),
            tuple(last_m(m, w, 2) for m, w in zip(memory.values, self.values)),
            last_m(ops.cast(memory.valid, "bool"), ops.cast(self.valid, "bool"), 1))

    def merged_if_full(self):
        """Every W tokens: the window moves into the memory (the one copy of the memory)."""
        def merge():
            return RecentWindowMemory(self._joined(self.window), self.keys, self.values,
                                      ops.zeros_like(self.valid), ops.zeros_like(self.filled))
        return ops.cond(self.filled >= self.window, merge, lambda: self)

    def to_memory(self):
        """The `KeyValueMemory` of the newest M positions."""
        return self._joined(self.filled)
