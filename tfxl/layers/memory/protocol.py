"""What every memory type and its per-layer view answer: `Memory` and `LayerView`.

Shape glossary: B batch (streams), L layers, M memory length, T segment length, K keys attended,
D model size, N heads, H head size.

A memory type owns its layout; the attention owns none. The model asks a memory, per call, which
keys each query sees (`attention_mask`), how many distances the position keys cover
(`key_length`), each layer's view (`layer(l)`) and the memory after the segment (`updated`). The
attention asks a layer's view how the segment's rows become the keys and values attended to and
how the position scores line up with them (`attend`, an `AttendedKeys`). The types implement
these structurally (a `typing.NamedTuple` takes no base class); `tests/test_memory_types.py`
checks that each defines every member itself.
"""

from typing import Any, Callable, NamedTuple, Protocol, runtime_checkable

import keras

# The names of a memory's tensors where it is a dict (SavedModel signatures, checkpoints).
STATES = "states"
KEYS = "keys"
VALUES = "values"
VALID = "valid"


class AttendedKeys(NamedTuple):
    """What one layer attends to, as its memory lays it out (`RelativeMultiHeadAttention`'s
    `compute_attention` reads it).

    keys: parts [B, N, H, S_i]; values: parts [B, N, S_i, H] (scores are concatenated over the
      parts, so cached rows are never copied to join the new ones).
    position_score: (query + v [B, N, T, H], position keys [N, H, K + 1]) -> the position scores
      [B, N, T, K] in the order of the keys (the view's `position_score`, bound to the layer).
    written: what the layer returns: the segment's (keys, values), or the buffers the rows were
      written into.
    """

    keys: list
    values: list
    position_score: Callable
    written: Any


@runtime_checkable
class LayerView(Protocol):
    """One layer of a memory, as `Memory.layer(l)` gives it to the attention."""

    def attend(self, attention, segment) -> AttendedKeys:
        """The keys and values the normalised `segment` [B, T, D] attends to, `attention`'s
        projections applied to the rows that need them."""

    def position_score(self, attention, query, position_keys):
        """[B, N, T, K]: `attention.position_score` (keys oldest first, the segment's T rows
        last) laid out as this view lays out the keys."""

    def kept(self, layer_input, written):
        """What the memory keeps of this layer's segment, for `Memory.updated`: of the layer's
        input [B, T, D] and what the attention returned (`AttendedKeys.written`)."""

    def written_spec(self, hidden, n_head, d_head, dtype):
        """The `keras.KerasTensor`s of what the attention returns as written."""


@runtime_checkable
class Memory(Protocol):
    """A memory type: what every layer remembers of the positions before the segment."""

    @property
    def mem_len(self) -> int:
        """M: the positions before the segment a query can see at most."""

    def key_length(self, segment_len) -> int:
        """K, the distances the position keys must cover (`model.position_keys(K)`) for segments
        of `segment_len` rows; ValueError where such segments do not fit this memory."""

    def layer(self, index) -> LayerView:
        """Layer `index`'s view."""

    def attention_mask(self, segment_len, same_length=False, segment_valid=None):
        """[B, 1, T, K] bool: which keys each query sees (True: attend), in the keys' order.
        `segment_valid` [B, T]: False at padding tokens, which no query sees."""

    def reset(self, reset) -> "Memory":
        """The rows where `reset` [B] is true emptied (a new stream or document begins); None
        changes nothing."""

    def with_invalid_slots_zeroed(self) -> "Memory":
        """The memory with the slots marked invalid made harmless (what they hold may be NaN);
        the model applies it once where a memory enters."""

    def updated(self, kept, segment_len, segment_valid=None, stop_gradient=True) -> "Memory":
        """The memory after the segment: `kept` is each layer's `layer(l).kept(...)`, in order;
        `segment_valid` [B, T] as in `attention_mask` (padding is never remembered). Without
        gradient unless `stop_gradient` is False (document classification's window of segments
        read with gradient)."""


def key_value_spec(hidden, n_head, d_head, dtype, length=None):
    """Keys [B, N, H, length] and values [B, N, length, H] as `keras.KerasTensor`s (length:
    default the segment's T)."""
    batch, length = hidden.shape[0], hidden.shape[1] if length is None else length
    return (keras.KerasTensor((batch, n_head, d_head, length), dtype),
            keras.KerasTensor((batch, n_head, length, d_head), dtype))
