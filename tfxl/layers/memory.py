"""Transformer-XL memory: what each layer remembers of the last M positions (Dai et al. 2019, 3.2).

Shape glossary: B batch (streams), L layers, M memory length, T segment length, K keys attended,
D model size, N heads, H head size.

Every memory type is a `typing.NamedTuple` of tensors, so that `keras.tree`, `tf.nest`,
`tf.function` signatures and loops take it as it is on every backend. The model accepts any and
returns the type it was given. Dicts of tensors appear only where a memory crosses a boundary
that has no Python types (SavedModel signatures: `to_dict`, `from_dict`).

A memory type owns its layout; the attention owns none. Each type answers, per layer
(`layer(l)`), how the segment's rows become the keys and values attended to (`attend`: an
`AttendedKeys`), and, for the model, which keys each query sees (`attention_mask`), how many
distances the position keys cover (`key_length`) and the memory after the segment (`updated`).

| type               | keys attended                          | used by                         |
|--------------------|----------------------------------------|---------------------------------|
| `LayerInputMemory` | layer inputs re-projected with the     | training (W_k, W_v learn through|
|                    | segment's rows, oldest first           | the memory rows), the paper's   |
| `KeyValueMemory`   | cached keys/values, then the segment's | evaluation, serving, prompts    |
|                    | rows appended (only T rows projected)  |                                 |
| `KeyValueRing`     | S fixed slots; the segment written     | loops of equal segments         |
|                    | over the T oldest                      | (evaluation, document scoring)  |
| `RecentWindowMemory` | a fixed memory plus a W-slot window  | generation, one token a step    |
|                    | the token is written into              |                                 |
| `PositionCache`    | S slots by absolute position, the      | keras-hub's cache (tfxl.hub)    |
|                    | token written at its position          |                                 |

Bytes per row: the layer-input memory 4·L·M·D (float32); the key/value types 2·N·H/D times that.
Keys are stored as each head's [H, M] matrix, values as [M, H]: q . k and probs . v are plain
matmuls reading them in place (a transposed operand is packed into a fresh copy first). One
tensor per layer: slicing layers out of [B, L, ...] and stacking them back would copy the whole
memory twice per step.

Shapes are static (M is fixed) so steps compile once under XLA/TPU; the mask keeps the semantics
exact: a fresh or reset memory has no valid slot and is never attended to (the original TF code
attends to zero-filled slots after a reset). Memory carries no gradient (the paper's truncated
backpropagation), except where a caller asks for it (`updated(..., stop_gradient=False)`, which
document classification uses inside its window of segments read with gradient).
"""

from typing import Any, NamedTuple, Tuple

import keras
from keras import ops

# The names of a memory's tensors where it is a dict (SavedModel signatures, checkpoints).
STATES = "states"
KEYS = "keys"
VALUES = "values"
VALID = "valid"


class AttendedKeys(NamedTuple):
    """What one layer attends to, as a memory type lays it out (`RelativeMultiHeadAttention`'s
    `compute_attention` reads it).

    keys: parts [B, N, H, S_i]; values: parts [B, N, S_i, H] (scores are concatenated over the
      parts, so cached rows are never copied to join the new ones).
    segment_start: None when the keys are oldest first with the segment's T rows last; else the
      slot p of the segment's first row in a cyclic buffer of K = sum S_i slots, the older keys
      before it wrapping around (the position scores are rolled by p + T).
    written: what the layer returns for `updated`: the segment's (keys, values), or the buffers
      the rows were written into.
    """

    keys: list
    values: list
    segment_start: Any
    written: Any


def _zero_invalid(tensor, valid_index):
    """`tensor` with zeros where the broadcast `valid_index` is False."""
    return ops.where(valid_index, tensor, ops.zeros((), tensor.dtype))


def _last_slots(old, new, axis):
    """The last old.shape[axis] slots of [old; new] along `axis`, with the static shape restated
    (a segment of unknown length T makes the slice's shape unknown; loops and XLA need it)."""
    mem_len = old.shape[axis]
    if not mem_len:
        return old
    window = ops.concatenate([old, ops.cast(new, old.dtype)], axis=axis)
    window = window[(slice(None),) * axis + (slice(-mem_len, None),)]
    return ops.reshape(window, (-1,) + tuple(old.shape[1:]))


def _next_valid(valid, segment_len, segment_valid):
    """valid [B, M] after a segment of `segment_len` rows (`segment_valid` [B, T]: which are
    real tokens, default all)."""
    if segment_valid is None:
        segment_valid = ops.ones((ops.shape(valid)[0], segment_len), dtype="bool")
    return _last_slots(valid, ops.cast(segment_valid, "bool"), axis=1)


def _reset(valid, reset):
    """valid [B, M] with the rows where `reset` [B] is true emptied."""
    if reset is None:
        return valid
    keep = ops.logical_not(ops.cast(reset, "bool"))[:, None]
    return ops.logical_and(ops.cast(valid, "bool"), keep)


def _key_value_spec(hidden, n_head, d_head, dtype, length=None):
    batch, length = hidden.shape[0], hidden.shape[1] if length is None else length
    return (keras.KerasTensor((batch, n_head, d_head, length), dtype),
            keras.KerasTensor((batch, n_head, length, d_head), dtype))


def _written_into(buffer_keys, buffer_values, slot, keys, values):
    """The buffers with rows `keys` [B, N, H, T] / `values` [B, N, T, H] written at `slot`
    (`ops.slice_update`: in place where the buffer is an XLA loop variable or a donated JAX
    buffer)."""
    zero = ops.zeros((), "int32")
    slot = ops.cast(slot, "int32")
    return (ops.slice_update(ops.cast(buffer_keys, keys.dtype), (zero, zero, zero, slot), keys),
            ops.slice_update(ops.cast(buffer_values, values.dtype), (zero, zero, slot, zero),
                             values))


# -- per-layer views: how a segment's rows become the keys attended ---------------------------
class LayerInputRows(NamedTuple):
    """One layer of a `LayerInputMemory`: its inputs [B, M, D], projected with the segment's rows
    in one GEMM (training: W_k and W_v learn through the memory rows)."""

    states: Any

    def attend(self, attention, segment):
        memory = attention.normalized(ops.cast(self.states, segment.dtype))
        keys, values = attention.key_value(ops.concatenate([memory, segment], axis=1))
        mem_len = self.states.shape[1]
        return AttendedKeys([keys], [values], None,
                            (keys[:, :, :, mem_len:], values[:, :, mem_len:]))

    def written_spec(self, hidden, n_head, d_head, dtype):
        return _key_value_spec(hidden, n_head, d_head, dtype)


class KeyValueParts(NamedTuple):
    """One layer of cached keys and values, then the segment's own rows (only those projected).

    parts: (keys [B, N, H, S], values [B, N, S, H]) pairs, oldest first.
    """

    parts: Tuple[Any, ...]

    def attend(self, attention, segment):
        keys, values = attention.key_value(segment)
        return AttendedKeys([ops.cast(k, keys.dtype) for k, _ in self.parts] + [keys],
                            [ops.cast(v, values.dtype) for _, v in self.parts] + [values],
                            None, (keys, values))

    def written_spec(self, hidden, n_head, d_head, dtype):
        return _key_value_spec(hidden, n_head, d_head, dtype)


class RingSlots(NamedTuple):
    """One layer's buffers of S slots; the segment's T rows are written at `slot` and the segment
    attends to all S (a `KeyValueRing` layer, a `PositionCache` layer)."""

    keys: Any    # [B, N, H, S]
    values: Any  # [B, N, S, H]
    slot: Any    # int32 scalar

    def attend(self, attention, segment):
        keys, values = _written_into(self.keys, self.values, self.slot,
                                     *attention.key_value(segment))
        return AttendedKeys([keys], [values], self.slot, (keys, values))

    def written_spec(self, hidden, n_head, d_head, dtype):
        return _key_value_spec(hidden, n_head, d_head, dtype, self.values.shape[2])


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
                            self.memory_values.shape[2] + self.filled, (keys, values))

    def written_spec(self, hidden, n_head, d_head, dtype):
        return _key_value_spec(hidden, n_head, d_head, dtype, self.values.shape[2])


LAYER_MEMORY_TYPES = (LayerInputRows, KeyValueParts, RingSlots, WindowSlots)


def as_layer_memory(memory):
    """One layer's memory as the attention takes it: a per-layer view (`memory.layer(l)`), or,
    for a caller of the layer itself, layer inputs [B, M, D] or a (keys [B, N, H, M], values
    [B, N, M, H]) pair."""
    if isinstance(memory, LAYER_MEMORY_TYPES):
        return memory
    if isinstance(memory, (tuple, list)):
        return KeyValueParts((tuple(memory),))
    return LayerInputRows(memory)


# -- memory types ---------------------------------------------------------------------------
class LayerInputMemory(NamedTuple):
    """The training memory: each layer's input at the last M positions (module docstring).

    states: [B, L, M, D] the input of layer l at the last M positions (layer 0: embeddings).
    valid:  [B, M] bool  which of those M slots hold a real token.
    """

    states: Any
    valid: Any

    @classmethod
    def empty(cls, batch_size, n_layer, mem_len, d_model, dtype="float32"):
        """No valid slot: [B, L, M, D] zeros and an all-False [B, M] mask."""
        return cls(ops.zeros((batch_size, n_layer, mem_len, d_model), dtype=dtype),
                   ops.zeros((batch_size, mem_len), dtype="bool"))

    @property
    def mem_len(self):
        return self.valid.shape[1]

    def key_length(self, segment_len):
        """K, the distances the position keys must cover: M + T."""
        return self.mem_len + segment_len

    def layer(self, index):
        return LayerInputRows(self.states[:, index])

    def attention_mask(self, segment_len, same_length=False, segment_valid=None):
        return attention_mask(self.valid, segment_len, same_length, segment_valid)

    def reset(self, reset):
        """The rows where `reset` [B] is true emptied (a new stream or document begins)."""
        return self._replace(valid=_reset(self.valid, reset))

    def with_invalid_slots_zeroed(self):
        """Zeros in the invalid slots' states (see `KeyValueMemory.with_invalid_slots_zeroed`)."""
        valid = ops.cast(self.valid, "bool")
        return self._replace(states=_zero_invalid(self.states, valid[:, None, :, None]))

    def updated(self, layer_inputs, written, segment_len, segment_valid=None,
                stop_gradient=True):
        """The last M positions of [this memory; the segment], stop-gradient unless
        `stop_gradient` is False (gradients then reach the segment through the next one).

        layer_inputs: L tensors [B, T, D], each layer's input for the segment; segment_valid:
        optional bool [B, T], False at padding tokens, which are never remembered. M may be
        smaller than, equal to or larger than T.
        """
        states = _last_slots(self.states, ops.stack(layer_inputs, axis=1), axis=2)
        return LayerInputMemory(ops.stop_gradient(states) if stop_gradient else states,
                                _next_valid(self.valid, segment_len, segment_valid))

    def to_dict(self):
        return {STATES: self.states, VALID: self.valid}


class KeyValueMemory(NamedTuple):
    """The inference memory: each layer's keys and values of the last M positions (module
    docstring). With fixed weights it holds exactly what the layer-input memory would be
    projected to (`TransfoXLBackbone.key_value_memory` converts), so a segment step projects
    only its T new rows.

    keys:   L × [B, N, H, M]  layer l's keys (W_k,E applied, after the pre-LN LayerNorm where
                              pre_lnorm)
    values: L × [B, N, M, H]  the same through W_v
    valid:  [B, M] bool
    """

    keys: Tuple[Any, ...]
    values: Tuple[Any, ...]
    valid: Any

    @classmethod
    def empty(cls, batch_size, n_layer, mem_len, n_head, d_head, dtype="float32"):
        """No valid slot: zero keys and values, an all-False [B, M] mask."""
        keys = ops.zeros((batch_size, n_head, d_head, mem_len), dtype=dtype)
        values = ops.zeros((batch_size, n_head, mem_len, d_head), dtype=dtype)
        return cls((keys,) * n_layer, (values,) * n_layer,
                   ops.zeros((batch_size, mem_len), dtype="bool"))

    @classmethod
    def from_stacked(cls, keys, values, valid):
        """From the stacked form keys [B, L, N, H, M], values [B, L, N, M, H] (signatures)."""
        n_layer = keys.shape[1]
        return cls(tuple(keys[:, i] for i in range(n_layer)),
                   tuple(values[:, i] for i in range(n_layer)), valid)

    @property
    def mem_len(self):
        return self.valid.shape[1]

    def key_length(self, segment_len):
        return self.mem_len + segment_len

    def layer(self, index):
        return KeyValueParts(((self.keys[index], self.values[index]),))

    def attention_mask(self, segment_len, same_length=False, segment_valid=None):
        return attention_mask(self.valid, segment_len, same_length, segment_valid)

    def reset(self, reset):
        """The rows where `reset` [B] is true emptied (a new stream or document begins)."""
        return self._replace(valid=_reset(self.valid, reset))

    def with_invalid_slots_zeroed(self):
        """Zeros in the values of the invalid slots.

        Why: a masked key's attention probability is exactly 0, but 0 x NaN = NaN, and a slot
        marked invalid may hold anything (a client's NaN or Inf). Keys need nothing (their scores
        are replaced by the mask). The model applies this once per call, where a memory enters,
        not in the attention: per layer it would copy the memory again on every generated token;
        and every memory the model returns is built from the cleaned one, so loops stay clean.
        """
        valid = ops.cast(self.valid, "bool")[:, None, :, None]
        return self._replace(values=tuple(_zero_invalid(v, valid) for v in self.values))

    def updated(self, layer_inputs, written, segment_len, segment_valid=None,
                stop_gradient=True):
        """The last M positions of [this memory; the segment's keys and values] (`written`:
        L pairs of keys [B, N, H, T] and values [B, N, T, H]), stop-gradient."""
        return KeyValueMemory(
            tuple(ops.stop_gradient(_last_slots(old, new, axis=3))
                  for old, (new, _) in zip(self.keys, written)),
            tuple(ops.stop_gradient(_last_slots(old, new, axis=2))
                  for old, (_, new) in zip(self.values, written)),
            _next_valid(self.valid, segment_len, segment_valid))

    def to_dict(self):
        """The stacked form: keys [B, L, N, H, M], values [B, L, N, M, H], valid [B, M]."""
        return {KEYS: ops.stack(self.keys, axis=1), VALUES: ops.stack(self.values, axis=1),
                VALID: self.valid}


class KeyValueRing(NamedTuple):
    """The key/value memory as fixed buffers that segments are written into in place: a ring.

    For loops that read segments of one length T (evaluation, whole-document scoring): each layer
    keeps S slots of keys and values; a segment's T new rows are written over the T oldest slots
    and the segment attends to all S slots, each at its own distance. The `KeyValueMemory`
    instead appends the T rows and keeps the last M (a concatenation and a slice: two copies of
    every layer's memory per segment, which at M in the thousands cost as much as the segment's
    attention). Measured gain over the appended memory (BENCHMARKS.md, "Evaluation paths", T 80,
    batch 16, 2 CPU cores): +13% tokens/s at M 2100 and +6% at M 512 without XLA; with XLA
    within 3% either way passed as tensors, +5% at M 2100 held in variables.

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
        """M + T: the distances a query can see (the S - M - T spare slots are never seen; the
        attention gives them zero position keys)."""
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
        return self._replace(valid=_reset(self.valid, reset))

    def with_invalid_slots_zeroed(self):
        """The ring itself (see the class docstring: `from_memory` cleaned it)."""
        return self

    def attention_mask(self, segment_len, same_length=False, segment_valid=None):
        """[B, 1, T, S] bool: `attention_mask`'s rule, in ring order.

        Built oldest first, as `attention_mask` builds it for a memory of S - T slots whose
        first S - M - T are never valid, and rolled to ring order as the position scores are
        (slot j holds oldest-first slot (j - p - T) mod S). A roll fuses into the softmax's
        input as index arithmetic; a gather of each slot's validity did not (XLA recomputed it
        for every score: +27% of the attention's CPU time at M 2100).
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

    def updated(self, layer_inputs, written, segment_len, segment_valid=None,
                stop_gradient=True):
        """After a segment of T rows: the layers' rings (`written`, the segment's rows in them),
        stop-gradient; the mask moved on; the next slot."""
        return KeyValueRing(tuple(ops.stop_gradient(k) for k, _ in written),
                            tuple(ops.stop_gradient(v) for _, v in written),
                            _next_valid(self.valid, segment_len, segment_valid),
                            (self.next_slot + segment_len) % self.size)

    def to_memory(self):
        """The `KeyValueMemory` of the last M positions, oldest first (one gather per tensor)."""
        slots = (self.next_slot - self.mem_len + ops.arange(self.mem_len, dtype="int32")) % (
            self.size)
        return KeyValueMemory(tuple(ops.take(k, slots, axis=3) for k in self.keys),
                              tuple(ops.take(v, slots, axis=2) for v in self.values), self.valid)


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
        return self._replace(memory=self.memory.reset(reset), valid=_reset(self.valid, reset))

    def with_invalid_slots_zeroed(self):
        """Itself: its memory was cleaned where it entered the model, and only the model writes
        the window."""
        return self

    def updated(self, layer_inputs, written, segment_len, segment_valid=None,
                stop_gradient=True):
        """The window with the token (in `written`) at slot r, r + 1 slots in use."""
        slot = ops.arange(self.window, dtype="int32") == self.filled
        token_valid = (ops.ones_like(self.valid[:, :1]) if segment_valid is None
                       else ops.cast(segment_valid, "bool"))
        return RecentWindowMemory(
            self.memory, tuple(ops.stop_gradient(k) for k, _ in written),
            tuple(ops.stop_gradient(v) for _, v in written),
            ops.logical_or(ops.cast(self.valid, "bool"),
                           ops.logical_and(slot[None], token_valid)), self.filled + 1)

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


class PositionCache(NamedTuple):
    """Keys and values by absolute position: S slots, the token at position t written at slot t
    (keras-hub's cache layout, `tfxl.hub`). Not a model memory: its caller runs
    `TransfoXLBackbone.run_blocks` with its own mask (which positions each row sees) and keeps
    the buffers each layer wrote.

    keys: L × [B, N, H, S]; values: L × [B, N, S, H]; position: int32 scalar t.
    """

    keys: Tuple[Any, ...]
    values: Tuple[Any, ...]
    position: Any

    def layer(self, index):
        return RingSlots(self.keys[index], self.values[index], self.position)


MEMORY_TYPES = (LayerInputMemory, KeyValueMemory, KeyValueRing, RecentWindowMemory)


def from_dict(memory):
    """The memory a dict of tensors stands for: {"states", "valid"} or {"keys", "values",
    "valid"} (keys and values stacked, as `to_dict` writes them)."""
    names = set(memory)
    if names == {STATES, VALID}:
        return LayerInputMemory(memory[STATES], memory[VALID])
    if names == {KEYS, VALUES, VALID}:
        return KeyValueMemory.from_stacked(memory[KEYS], memory[VALUES], memory[VALID])
    raise ValueError(f"a memory dict has the keys {sorted(names)}; expected "
                     f"{sorted((STATES, VALID))} or {sorted((KEYS, VALUES, VALID))}")


def as_memory(memory, where):
    """`memory` as a memory type; otherwise one TypeError naming what was given.

    A list or plain tuple of a type's fields, in order, is taken as that type: Keras' functional
    models rebuild a NamedTuple input as a list when a `.keras` file is loaded.
    """
    if isinstance(memory, MEMORY_TYPES):
        return memory
    if type(memory) in (list, tuple) and len(memory) == 2:
        return LayerInputMemory(*memory)
    if (type(memory) in (list, tuple) and len(memory) == 3
            and all(isinstance(part, (list, tuple)) for part in memory[:2])):
        keys, values, valid = memory
        return KeyValueMemory(tuple(keys), tuple(values), valid)
    hint = (" (a dict: convert it with tfxl.layers.memory.from_dict)"
            if isinstance(memory, dict) else "")
    raise TypeError(f"{where}: memory must be a LayerInputMemory or a KeyValueMemory (from "
                    f"init_memory / init_key_value_memory) or a KeyValueRing, got "
                    f"{type(memory).__name__}{hint}")


class MemoryVariables:
    """A memory carried across calls: one non-trainable variable per tensor of a memory.

    Args:
      empty: a memory of the shapes and dtypes to hold (e.g. `init_memory(B)`); its values are
        the initial ones.
      name: prefix of the variable names.
      make_variable: (initial value, name) -> variable; default a plain non-trainable
        `keras.Variable` (tfxl's trainer passes one that makes a per-replica copy).
    The holder is not a Keras layer: its variables are not weights, and not saved in `.keras`
    files.
    """

    def __init__(self, empty, name, make_variable=None):
        make_variable = make_variable or (lambda value, name: keras.Variable(
            value, dtype=value.dtype, trainable=False, name=name))
        leaves = keras.tree.flatten(empty)
        # A copy of each initial value: an empty memory's layers share one zeros tensor, and
        # JAX's trainer donates each variable's buffer to its compiled step (once per buffer).
        self.variables = keras.tree.pack_sequence_as(empty, [
            make_variable(ops.copy(value), f"{name}_{i}") for i, value in enumerate(leaves)])

    @property
    def valid(self):
        """The variable of the [B, M] valid mask."""
        return self.variables.valid

    def read(self):
        """The memory held now."""
        return keras.tree.map_structure(lambda variable: variable.value, self.variables)

    def write(self, memory):
        """Holds `memory` (a memory of the same type and shapes) from now on."""
        keras.tree.map_structure(lambda variable, value: variable.assign(
            ops.cast(value, variable.dtype)), self.variables, memory)

    def clear(self):
        """Marks every slot empty; the model never attends to such slots."""
        self.valid.assign(ops.zeros(self.valid.shape, "bool"))


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
