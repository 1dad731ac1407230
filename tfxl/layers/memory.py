"""Transformer-XL memory: what each layer remembers of the last M positions (Dai et al. 2019, 3.2).

Shape glossary: B batch (streams), L layers, M memory length, T segment length, K = M + T keys,
D model size, N heads, H head size.

A memory is one of three types, all `typing.NamedTuple`s of tensors, so that `keras.tree`,
`tf.nest`, `tf.function` signatures and loops take them as they are on every backend. The model
accepts any and returns the type it was given. Dicts of tensors appear only where a memory
crosses a boundary that has no Python types (SavedModel signatures: `to_dict`, `from_dict`).

`LayerInputMemory` (training; the paper's): 4·L·M·D bytes per row in float32.
  states: [B, L, M, D]       the input of layer l at the last M positions (layer 0: embeddings).
  valid:  [B, M] bool        which of those M slots hold a real token.
  Training needs it: W_k and W_v receive gradients through the memory rows they project.

`KeyValueMemory` (evaluation, generation, serving): 2·N·H/D times the layer-input memory.
  keys:   L × [B, N, H, M]   layer l's keys of the last M positions (W_k,E applied, after the
                             pre-LN LayerNorm where pre_lnorm), stored as each head's [H, M]
                             matrix so that q . k is a plain matmul reading them in place (a
                             transposed operand is packed into a fresh copy first).
  values: L × [B, N, M, H]   the same through W_v, each head's [M, H] matrix (probs . v reads it
                             in place).
  valid:  [B, M] bool        as above.
  One tensor per layer: slicing each layer out of [B, L, ...] and stacking the layers back would
  copy the whole memory twice per step, which at M in the thousands costs more than a one-token
  step's attention. With fixed weights it holds exactly what the layer-input memory would be
  projected to, so a segment step projects only its T new rows
  (`TransfoXLBackbone.key_value_memory` converts).

`KeyValueRing` (loops of equal segments: evaluation, whole-document scoring): the key/value
  memory kept in fixed buffers of S >= M + T slots that each segment's rows are written into in
  place of the oldest, rather than appended and sliced (see the class).

Shapes are static (M is fixed) so steps compile once under XLA/TPU; the mask keeps the semantics
exact: a fresh or reset memory has no valid slot and is never attended to (the original TF code
attends to zero-filled slots after a reset). Memory carries no gradient (the paper's truncated
backpropagation), except where a caller asks for it: `LayerInputMemory.updated(...,
stop_gradient=False)`, which document classification uses inside its window of segments read
with gradient (`tfxl.classification`).
"""

from typing import Any, NamedTuple, Tuple

import keras
from keras import ops

# The names of a memory's tensors where it is a dict (SavedModel signatures, checkpoints).
STATES = "states"
KEYS = "keys"
VALUES = "values"
VALID = "valid"


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


def _next_valid(valid, new_rows, segment_valid):
    """valid [B, M] after a segment whose first row's slice `new_rows` [B, T] gives its length."""
    if segment_valid is None:
        segment_valid = ops.ones_like(new_rows, dtype="bool")
    return _last_slots(valid, ops.cast(segment_valid, "bool"), axis=1)


def _reset(valid, reset):
    """valid [B, M] with the rows where `reset` [B] is true emptied."""
    if reset is None:
        return valid
    keep = ops.logical_not(ops.cast(reset, "bool"))[:, None]
    return ops.logical_and(ops.cast(valid, "bool"), keep)


class LayerInputMemory(NamedTuple):
    """The training memory: each layer's input at the last M positions (module docstring)."""

    states: Any  # [B, L, M, D]
    valid: Any   # [B, M] bool

    @classmethod
    def empty(cls, batch_size, n_layer, mem_len, d_model, dtype="float32"):
        """No valid slot: [B, L, M, D] zeros and an all-False [B, M] mask."""
        return cls(ops.zeros((batch_size, n_layer, mem_len, d_model), dtype=dtype),
                   ops.zeros((batch_size, mem_len), dtype="bool"))

    @property
    def mem_len(self):
        return self.valid.shape[1]

    def layer(self, index):
        """Layer `index`'s memory as the attention takes it: its inputs [B, M, D]."""
        return self.states[:, index]

    def reset(self, reset):
        """The rows where `reset` [B] is true emptied (a new stream or document begins)."""
        return self._replace(valid=_reset(self.valid, reset))

    def with_invalid_slots_zeroed(self):
        """Zeros in the invalid slots' states (see `KeyValueMemory.with_invalid_slots_zeroed`)."""
        valid = ops.cast(self.valid, "bool")
        return self._replace(states=_zero_invalid(self.states, valid[:, None, :, None]))

    def updated(self, layer_inputs, segment_valid=None, stop_gradient=True):
        """The last M positions of [this memory; the segment], stop-gradient unless
        `stop_gradient` is False (gradients then reach the segment through the next one).

        layer_inputs: L tensors [B, T, D], each layer's input for the segment; segment_valid:
        optional bool [B, T], False at padding tokens, which are never remembered. M may be
        smaller than, equal to or larger than T.
        """
        current = ops.stack(layer_inputs, axis=1)  # [B, L, T, D]
        states = _last_slots(self.states, current, axis=2)
        return LayerInputMemory(ops.stop_gradient(states) if stop_gradient else states,
                                _next_valid(self.valid, current[:, 0, :, 0], segment_valid))

    def to_dict(self):
        return {STATES: self.states, VALID: self.valid}


class KeyValueMemory(NamedTuple):
    """The inference memory: each layer's keys and values of the last M positions (module
    docstring)."""

    keys: Tuple[Any, ...]    # L × [B, N, H, M]
    values: Tuple[Any, ...]  # L × [B, N, M, H]
    valid: Any               # [B, M] bool

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

    def layer(self, index):
        """Layer `index`'s memory as the attention takes it: (keys, values)."""
        return self.keys[index], self.values[index]

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

    def updated(self, segment_keys, segment_values, segment_valid=None):
        """The last M positions of [this memory; the segment's keys and values], stop-gradient.

        segment_keys: L tensors [B, N, H, T]; segment_values: L tensors [B, N, T, H].
        """
        return KeyValueMemory(
            tuple(ops.stop_gradient(_last_slots(old, new, axis=3))
                  for old, new in zip(self.keys, segment_keys)),
            tuple(ops.stop_gradient(_last_slots(old, new, axis=2))
                  for old, new in zip(self.values, segment_values)),
            _next_valid(self.valid, segment_keys[0][:, 0, 0, :], segment_valid))

    def to_dict(self):
        """The stacked form: keys [B, L, N, H, M], values [B, L, N, M, H], valid [B, M]."""
        return {KEYS: ops.stack(self.keys, axis=1), VALUES: ops.stack(self.values, axis=1),
                VALID: self.valid}


class KeyValueRing(NamedTuple):
    """The key/value memory as fixed buffers that segments are written into in place: a ring.

    For loops that read segments of one length T (evaluation, whole-document scoring): each layer
    keeps S slots of keys and values; a segment's T new rows are written over the T oldest slots
    (`ops.slice_update`: in place where the buffer is an XLA loop variable, a resource variable
    updated inside the compiled step, or a donated JAX buffer) and the segment attends to all S
    slots, each at its own distance. The `KeyValueMemory` instead appends the T rows and keeps the
    last M (a concatenation and a slice: two copies of every layer's memory per segment, which at
    M in the thousands cost as much as the segment's attention).

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

    def check_segment_len(self, segment_len):
        """Raises ValueError unless segments of `segment_len` rows fit this ring."""
        if self.size % segment_len or self.size < self.mem_len + segment_len:
            raise ValueError(
                f"a KeyValueRing of {self.size} slots and M = {self.mem_len} takes segments of "
                f"{self.size - self.mem_len} tokens or a divisor of {self.size} that leaves M + T "
                f"<= {self.size}; got T = {segment_len}")

    def layer(self, index):
        return self.keys[index], self.values[index]

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
        mem_len, size = self.mem_len, self.size
        spare = ops.zeros((ops.shape(self.valid)[0], size - mem_len - segment_len), "bool")
        mask = attention_mask(ops.concatenate([spare, ops.cast(self.valid, "bool")], axis=1),
                              segment_len, False, segment_valid)
        if same_length:  # every query sees M + 1 positions: key j >= i + S - T - M
            query = ops.arange(segment_len)[:, None]
            mask = ops.logical_and(mask, ops.arange(size)[None, :] >= query + size - segment_len
                                   - mem_len)
        return ops.roll(mask, (self.next_slot + segment_len) % size, axis=-1)

    def updated(self, keys, values, segment_len, segment_valid=None):
        """After a segment of T = `segment_len` rows: the layers' rings `keys` and `values` with
        its rows written (by the attention), stop-gradient; the mask moved on; the next slot."""
        if segment_valid is None:
            segment_valid = ops.ones((ops.shape(self.valid)[0], segment_len), dtype="bool")
        return KeyValueRing(tuple(ops.stop_gradient(k) for k in keys),
                            tuple(ops.stop_gradient(v) for v in values),
                            _last_slots(self.valid, ops.cast(segment_valid, "bool"), axis=1),
                            (self.next_slot + segment_len) % self.size)

    def to_memory(self):
        """The `KeyValueMemory` of the last M positions, oldest first (one gather per tensor)."""
        slots = (self.next_slot - self.mem_len + ops.arange(self.mem_len, dtype="int32")) % (
            self.size)
        return KeyValueMemory(tuple(ops.take(k, slots, axis=3) for k in self.keys),
                              tuple(ops.take(v, slots, axis=2) for v in self.values), self.valid)


MEMORY_TYPES = (LayerInputMemory, KeyValueMemory, KeyValueRing)


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
