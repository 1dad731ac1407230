"""Dropout with a counter-hash mask: Keras' Dropout contract, a mask that is cheap under XLA.

Why: XLA lowers TensorFlow's stateless Philox generator to scalar CPU code costing ~20-300 ns per
element, which was most of an XLA training step of the benchmark model (BENCHMARKS.md); a keyed
integer hash of the element index (lowbias32 rounds, ~10 vectorisable uint32 ops) costs ~0.5 ns.
"""

import keras
import tensorflow as tf
from keras import ops

_GOLDEN = 0x9E3779B9


def _mix32(h):
    """A 32-bit integer finaliser (lowbias32): xor-shift / multiply rounds, all uint32 ops."""
    h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, tf.constant(16, tf.uint32)))
    h = h * tf.constant(0x7FEB352D, tf.uint32)
    h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, tf.constant(15, tf.uint32)))
    h = h * tf.constant(0x846CA68B, tf.uint32)
    return tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, tf.constant(16, tf.uint32)))


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
        seed = ops.convert_to_tensor(self.seed_generator.next())
        seed = tf.cast(tf.math.floormod(tf.cast(seed, tf.int64), 2**32), tf.uint32)
        key1 = _mix32(seed[0] * tf.constant(_GOLDEN, tf.uint32) + seed[1])
        key2 = _mix32(key1 + seed[1] * tf.constant(0x85EBCA6B, tf.uint32)
                      + tf.constant(1, tf.uint32))
        index = tf.reshape(tf.cast(tf.range(tf.size(inputs, out_type=tf.int32)), tf.uint32),
                           tf.shape(inputs))
        bits = _mix32(_mix32(tf.bitwise.bitwise_xor(index, key1)) + key2)
        threshold = min(int(round(self.rate * 2.0 ** 32)), 2**32 - 1)
        keep = bits >= tf.constant(threshold, tf.uint32)
        return tf.where(keep, inputs * tf.cast(1.0 / (1.0 - self.rate), inputs.dtype),
                        tf.zeros_like(inputs))
