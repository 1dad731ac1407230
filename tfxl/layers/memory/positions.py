"""The position cache: keys and values by absolute position (keras-hub's cache, `tfxl.hub`).

Shape glossary: B batch, L layers, S slots (positions), N heads, H head size.
"""

from typing import Any, NamedTuple, Tuple

from keras import ops

from tfxl.layers.memory.ring import RingSlots
from tfxl.layers.memory.slots import held


def _no_rows_marked(segment_valid=None, reset=None):
    if segment_valid is not None or reset is not None:
        raise ValueError("a PositionCache marks no slot invalid: padding and new sequences are "
                         "its caller's (a mask of its own through TransfoXLBackbone.run_blocks, "
                         "a new cache)")


class PositionCache(NamedTuple):
    """Keys and values by absolute position: S slots, the token at position t written at slot t,
    one token a step; every slot before it holds the token of its position (keras-hub's cache
    layout, `tfxl.hub`). Its own mask lets the token see slots 0..t; keras-hub's model narrows
    that (the last M positions, the whole prompt) with a mask of its own through
    `TransfoXLBackbone.run_blocks`, and starts each batch of sequences with a new cache, so a
    PositionCache marks no slot invalid (`reset` and `segment_valid` are refused).

    keys: L × [B, N, H, S]; values: L × [B, N, S, H]; position: int32 scalar t.
    """

    keys: Tuple[Any, ...]
    values: Tuple[Any, ...]
    position: Any

    @classmethod
    def empty(cls, batch_size, n_layer, size, n_head, d_head, dtype="float32"):
        """S = `size` zero slots, the first token to be written at slot 0."""
        keys = ops.zeros((batch_size, n_head, d_head, size), dtype=dtype)
        values = ops.zeros((batch_size, n_head, size, d_head), dtype=dtype)
        return cls((keys,) * n_layer, (values,) * n_layer, ops.zeros((), "int32"))

    @property
    def size(self):
        return self.values[0].shape[2]

    @property
    def mem_len(self):
        """S - 1: the earlier positions the token at the last slot sees."""
        return self.size - 1

    def key_length(self, segment_len):
        """S: the distances 0..S - 1."""
        if segment_len != 1:
            raise ValueError(f"a PositionCache reads one token per call; got {segment_len}")
        return self.size

    def layer(self, index):
        return RingSlots(self.keys[index], self.values[index], self.position)

    def attention_mask(self, segment_len, same_length=False, segment_valid=None):
        """[B, 1, 1, S]: slots 0..t (`same_length` changes nothing for a single query)."""
        _no_rows_marked(segment_valid)
        seen = ops.arange(self.size, dtype="int32") <= ops.cast(self.position, "int32")
        batch = ops.shape(self.values[0])[0]
        return ops.broadcast_to(seen[None, None, None, :], (batch, 1, 1, self.size))

    def reset(self, reset):
        _no_rows_marked(reset=reset)
        return self

    def with_invalid_slots_zeroed(self):
        """Itself: no slot is marked invalid."""
        return self

    def updated(self, kept, segment_len, segment_valid=None, stop_gradient=True):
        """The buffers with the token at slot t (`kept`), the next token's position t + 1."""
        _no_rows_marked(segment_valid)
        return PositionCache(tuple(held(k, stop_gradient) for k, _ in kept),
                             tuple(held(v, stop_gradient) for _, v in kept),
                             self.position + segment_len)
