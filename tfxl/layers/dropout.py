"""Dropout with a counter-hash mask: Keras' Dropout contract, a mask that is cheap under XLA.

Why: XLA lowers TensorFlow's stateless Philox generator to scalar CPU code costing ~20-300 ns per
element, which was most of an XLA training step of the benchmark model (BENCHMARKS.md); a keyed
integer hash of the element index (lowbias32 rounds, ~10 vectorisable uint32 ops) costs ~0.5 ns.
"""

import keras
from keras import ops

from tfxl.layers import counter_hash


def keep_mask(shape, seed, rate):
    """The elements HashDropout keeps: bool `shape`, from `seed` (2 integers, taken modulo 2^32)
    and `rate`. Element i is kept when its hash bits (`counter_hash.hash_bits`) are
    >= rate * 2^32."""
    threshold = min(int(round(rate * 2.0 ** 32)), 2**32 - 1)
    return counter_hash.hash_bits(shape, seed) >= counter_hash.constant(threshold)


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
