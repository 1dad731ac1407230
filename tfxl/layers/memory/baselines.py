"""The memories of the paper's baselines: what the vanilla Transformer and the LSTM carry from
one segment to the next.

Shape glossary: B batch (streams), M memory slots, L layers, D model size.

Neither is attended to as Transformer-XL's memory types are (protocol.py): each is read only by
its own model (tfxl/models/transformer_lm.py, tfxl/models/lstm_lm.py). Both are NamedTuples of
tensors with a `valid` mask whose first axis is the batch, so the holders of a memory carried
across calls (`MemoryVariables`, the trainer's and evaluator's per-replica copies) take them as
they take the others: `clear()` marks every row empty by zeroing `valid`, and a checkpoint
stores `to_dict()` (`as_memory` reads it back).
"""

from typing import Any, NamedTuple

from keras import ops

from tfxl.layers.memory.slots import last_slots, next_valid, reset_rows

TOKEN_IDS, HIDDEN, CELL, VALID = "token_ids", "hidden", "cell", "valid"


class TokenWindow(NamedTuple):
    """The vanilla Transformer's evaluation memory: the ids of the last M tokens read.

    token_ids: [B, M] int32, oldest first.
    valid:     [B, M] bool, which slots hold a token of the row's current document.

    The model has no memory of hidden states: each position is scored by a fresh forward pass
    over its window (the M tokens before it and itself, M = tgt_len - 1), so the ids are all it
    keeps. Training carries nothing (`TransformerLM.init_memory` is None).
    """

    token_ids: Any
    valid: Any

    @classmethod
    def empty(cls, batch_size, mem_len):
        """No valid slot: [B, M] zeros and an all-False mask."""
        return cls(ops.zeros((batch_size, mem_len), "int32"),
                   ops.zeros((batch_size, mem_len), "bool"))

    @property
    def mem_len(self):
        return self.valid.shape[1]

    def reset(self, reset):
        """The rows where `reset` [B] is true emptied (a new document begins)."""
        return self._replace(valid=reset_rows(self.valid, reset))

    def updated(self, token_ids, segment_valid=None):
        """The last M ids of [this window; `token_ids` [B, T]]; `segment_valid` [B, T] False
        at padding tokens, which are never kept as valid."""
        segment_len = token_ids.shape[1] if token_ids.shape[1] is not None else (
            ops.shape(token_ids)[1])
        return TokenWindow(last_slots(self.token_ids, ops.cast(token_ids, "int32"), axis=1),
                           next_valid(self.valid, segment_len, segment_valid))

    def to_dict(self):
        return {TOKEN_IDS: self.token_ids, VALID: self.valid}


class RecurrentState(NamedTuple):
    """The LSTM's memory: every layer's state after the last token read (truncated
    back-propagation through time: it carries no gradient into the next segment).

    hidden: [B, L, D] each layer's output h.
    cell:   [B, L, D] each layer's cell c.
    valid:  [B] bool, False where a row starts afresh (zero state): a new stream, a restarted
      document, a cleared memory.
    """

    hidden: Any
    cell: Any
    valid: Any

    @classmethod
    def empty(cls, batch_size, n_layer, d_model, dtype="float32"):
        """The zero state, marked not valid."""
        return cls(ops.zeros((batch_size, n_layer, d_model), dtype),
                   ops.zeros((batch_size, n_layer, d_model), dtype),
                   ops.zeros((batch_size,), "bool"))

    @property
    def mem_len(self):
        """The state stands for every token read before; 0 slots of tokens are kept."""
        return 0

    def reset(self, reset):
        """The rows where `reset` [B] is true emptied (a new document begins)."""
        if reset is None:
            return self
        return self._replace(valid=ops.logical_and(
            ops.cast(self.valid, "bool"), ops.logical_not(ops.cast(reset, "bool"))))

    def with_invalid_rows_zeroed(self):
        """The zero state in the rows not valid (what a cleared variable holds may be
        anything)."""
        keep = ops.cast(self.valid, "bool")[:, None, None]
        return self._replace(
            hidden=ops.where(keep, self.hidden, ops.zeros((), self.hidden.dtype)),
            cell=ops.where(keep, self.cell, ops.zeros((), self.cell.dtype)))

    def to_dict(self):
        return {HIDDEN: self.hidden, CELL: self.cell, VALID: self.valid}
