"""Dropout with a counter-hash mask: Keras' Dropout contract, a mask that is cheap under XLA.

Why: XLA lowers TensorFlow's stateless Philox generator to scalar CPU code costing ~20-300 ns per
element, which was most of an XLA training step of the benchmark model (BENCHMARKS.md); a keyed
integer hash of the element index (lowbias32 rounds, ~10 vectorisable uint32 ops) costs ~0.5 ns.
"""

import keras
from keras import ops

_GOLDEN = 0x9E3779B9


def _uint32(value):
    return ops.convert_to_tensor(value, dtype="uint32")


def _mix32(h):
    """A 32-bit integer finaliser (lowbias32): xor-shift / multiply rounds, all uint32 ops (the
    products wrap modulo 2^32 on every backend)."""
    h = ops.bitwise_xor(h, ops.right_shift(h, _uint32(16)))
    h = h * _uint32(0x7FEB352D)
    h = ops.bitwise_xor(h, ops.right_shift(h, _uint32(15)))
    h = h * _uint32(0x846CA68B)
    return ops.bitwise_xor(h, ops.right_shift(h, _uint32(16)))


def keep_mask(shape, seed, rate):
    """The elements HashDropout keeps: bool `shape`, from `seed` (2 integers, taken modulo 2^32)
    and `rate`. Element i is kept when mix(mix(i ^ key1) + key2) >= rate * 2^32."""
    seed = ops.cast(seed, "uint32")  # two's complement: the seed modulo 2^32
    key1 = _mix32(seed[0] * _uint32(_GOLDEN) + seed[1])
    key2 = _mix32(key1 + seed[1] * _uint32(0x85EBCA6B) + _uint32(1))
    size = 1
    for dim in shape:
        size = size * dim
    index = ops.reshape(ops.cast(ops.arange(size, dtype="int32"), "uint32"), shape)
    bits = _mix32(_mix32(ops.bitwise_xor(index, key1)) + key2)
    threshold = min(int(round(rate * 2.0 ** 32)), 2**32 - 1)
    return bits >= _uint32(threshold)


@keras.saving.register_keras_serializable(package="tfxl")
class HashDropout(keras.layers.Dropout):
    """`keras.layers.Dropout` whose mask is a keyed hash of the element index.

    Same contract: keep each element with probability 1 - rate, scale kept ones by 1 / (1 - rate),
    identity when not training or rate == 0. Same seed source: one `seed_generator.next()` per
    call, so the RNG state is the layer's own variable (checkpointed; resumes reproduce the masks).
    Masks differ from Keras' for the same seed; their distribution is the same.
    """

    def call(self, inputs, training=False):
        if not training or self.rate <= 0.0:
            return inputs
        keep = keep_mask(ops.shape(inputs), self.seed_generator.next(), self.rate)
        return ops.where(keep, inputs * ops.cast(1.0 / (1.0 - self.rate), inputs.dtype),
                         ops.zeros_like(inputs))
