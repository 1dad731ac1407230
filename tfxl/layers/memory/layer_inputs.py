"""The layer-input memory (training) and its per-layer view.

Shape glossary: B batch, L layers, M memory length, T segment length, D model size, N heads,
H head size.
"""

import functools
from typing import Any, NamedTuple

from keras import ops

from tfxl.layers.memory.protocol import STATES, VALID, AttendedKeys, key_value_spec
from tfxl.layers.memory.slots import (attention_mask, held, last_slots, next_valid, reset_rows,
                                      zero_invalid)


class LayerInputRows(NamedTuple):
    """One layer of a `LayerInputMemory`: its inputs [B, M, D], projected with the segment's rows
    in one GEMM (training: W_k and W_v learn through the memory rows)."""

    states: Any

    def attend(self, attention, segment):
        memory = attention.normalized(ops.cast(self.states, segment.dtype))
        keys, values = attention.key_value(ops.concatenate([memory, segment], axis=1))
        mem_len = self.states.shape[1]
        return AttendedKeys([keys], [values], functools.partial(self.position_score, attention),
                            (keys[:, :, :, mem_len:], values[:, :, mem_len:]))

    def position_score(self, attention, query, position_keys):
        """The keys are oldest first with the segment's rows last: the scores as they are."""
        return attention.position_score(query, position_keys)

    def kept(self, layer_input, written):
        """The layer's input rows: a later segment projects them again."""
        return layer_input

    def written_spec(self, hidden, n_head, d_head, dtype):
        return key_value_spec(hidden, n_head, d_head, dtype)


class LayerInputMemory(NamedTuple):
    """The training memory: each layer's input at the last M positions (`tfxl.layers.memory`).

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
        return self._replace(valid=reset_rows(self.valid, reset))

    def with_invalid_slots_zeroed(self):
        """Zeros in the invalid slots' states (see `KeyValueMemory.with_invalid_slots_zeroed`)."""
        valid = ops.cast(self.valid, "bool")
        return self._replace(states=zero_invalid(self.states, valid[:, None, :, None]))

    def updated(self, kept, segment_len, segment_valid=None, stop_gradient=True):
        """The last M positions of [this memory; the segment], stop-gradient unless
        `stop_gradient` is False (gradients then reach the segment through the next one).

        kept: L tensors [B, T, D], each layer's input for the segment; segment_valid:
        optional bool [B, T], False at padding tokens, which are never remembered. M may be
        smaller than, equal to or larger than T.
        """
        states = last_slots(self.states, ops.stack(kept, axis=1), axis=2)
        return LayerInputMemory(held(states, stop_gradient),
                                next_valid(self.valid, segment_len, segment_valid))

    def to_dict(self):
        return {STATES: self.states, VALID: self.valid}
