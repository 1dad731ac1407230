"""The key/value memory (evaluation, serving, prompts) and its per-layer view.

Shape glossary: B batch, L layers, M memory length, T segment length, D model size, N heads,
H head size.
"""

import functools
from typing import Any, NamedTuple, Tuple

from keras import ops

from tfxl.layers.memory.protocol import KEYS, VALID, VALUES, AttendedKeys, key_value_spec
from tfxl.layers.memory.slots import (attention_mask, held, last_slots, next_valid, reset_rows,
                                      zero_invalid)


class KeyValueParts(NamedTuple):
    """One layer of cached keys and values, then the segment's own rows (only those projected).

    parts: (keys [B, N, H, S], values [B, N, S, H]) pairs, oldest first.
    """

    parts: Tuple[Any, ...]

    def attend(self, attention, segment):
        keys, values = attention.key_value(segment)
        return AttendedKeys([ops.cast(k, keys.dtype) for k, _ in self.parts] + [keys],
                            [ops.cast(v, values.dtype) for _, v in self.parts] + [values],
                            functools.partial(self.position_score, attention), (keys, values))

    def position_score(self, attention, query, position_keys):
        """The keys are oldest first with the segment's rows last: the scores as they are."""
        return attention.position_score(query, position_keys)

    def kept(self, layer_input, written):
        """The segment's keys and values, appended to the memory's."""
        return written

    def written_spec(self, hidden, n_head, d_head, dtype):
        return key_value_spec(hidden, n_head, d_head, dtype)


class KeyValueMemory(NamedTuple):
    """The inference memory: each layer's keys and values of the last M positions
    (`tfxl.layers.memory`). With fixed weights it holds exactly what the layer-input memory would
    be projected to (`TransfoXLBackbone.key_value_memory` converts), so a segment step projects
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
        return self._replace(valid=reset_rows(self.valid, reset))

    def with_invalid_slots_zeroed(self):
        """Zeros in the values of the invalid slots.

        Why: a masked key's attention probability is exactly 0, but 0 x NaN = NaN, and a slot
        marked invalid may hold anything (a client's NaN or Inf). Keys need nothing (their scores
        are replaced by the mask). The model applies this once per call, where a memory enters,
        not in the attention: per layer it would copy the memory again on every generated token;
        and every memory the model returns is built from the cleaned one, so loops stay clean.
        """
        valid = ops.cast(self.valid, "bool")[:, None, :, None]
        return self._replace(values=tuple(zero_invalid(v, valid) for v in self.values))

    def updated(self, kept, segment_len, segment_valid=None, stop_gradient=True):
        """The last M positions of [this memory; the segment's keys and values] (`kept`: L pairs
        of keys [B, N, H, T] and values [B, N, T, H])."""
        return KeyValueMemory(
            tuple(held(last_slots(old, new, axis=3), stop_gradient)
                  for old, (new, _) in zip(self.keys, kept)),
            tuple(held(last_slots(old, new, axis=2), stop_gradient)
                  for old, (_, new) in zip(self.values, kept)),
            next_valid(self.valid, segment_len, segment_valid))

    def to_dict(self):
        """The stacked form: keys [B, L, N, H, M], values [B, L, N, M, H], valid [B, M]."""
        return {KEYS: ops.stack(self.keys, axis=1), VALUES: ops.stack(self.values, axis=1),
                VALID: self.valid}
