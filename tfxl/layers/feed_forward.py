"""Position-wise feed-forward sub-layer with residual and LayerNorm.

Shape glossary: B batch, T segment length, D model size, F inner size (d_inner).
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


def fast_dropout(x, dropout_layer, training=None):
    """`dropout_layer(x, training)` with a counter-hash mask instead of Philox.

    Same contract as `keras.layers.Dropout` (keep with probability 1 - rate, scale kept values by
    1 / (1 - rate), identity when not training or rate == 0) and the same seed source: one
    `dropout_layer.seed_generator.next()` per call, so the RNG state is the layer's (checkpointed,
    reproducible). Why: XLA lowers TF's stateless Philox into scalar CPU code that costs
    ~20-300 ns per element (most of an XLA training step of the bench model); a keyed integer hash
    of the element index (two lowbias32 rounds, ~10 vectorisable uint32 ops) costs ~0.5 ns. Masks
    differ from Keras' for the same seed; their distribution is the same.
    """
    rate = float(dropout_layer.rate)
    if not training or rate <= 0.0:
        return x
    seed = ops.convert_to_tensor(dropout_layer.seed_generator.next())
    seed = tf.cast(tf.math.floormod(tf.cast(seed, tf.int64), 2**32), tf.uint32)
    key1 = _mix32(seed[0] * tf.constant(_GOLDEN, tf.uint32) + seed[1])
    key2 = _mix32(key1 + seed[1] * tf.constant(0x85EBCA6B, tf.uint32) + tf.constant(1, tf.uint32))
    shape = tf.shape(x)
    index = tf.reshape(tf.cast(tf.range(tf.size(x, out_type=tf.int32)), tf.uint32), shape)
    bits = _mix32(_mix32(tf.bitwise.bitwise_xor(index, key1)) + key2)
    keep = bits >= tf.constant(min(int(round(rate * 2.0 ** 32)), 2**32 - 1), tf.uint32)
    return tf.where(keep, x * tf.cast(1.0 / (1.0 - rate), x.dtype), tf.zeros_like(x))


@keras.saving.register_keras_serializable(package="tfxl")
class PositionwiseFeedForward(keras.layers.Layer):
    """LayerNorm(x + Dropout(W2 Dropout(ReLU(W1 x + b1)) + b2)), or the pre-LN variant.

    Call: hidden [B, T, D] -> [B, T, D].
    """

    def __init__(self, d_model, d_inner, dropout=0.0, pre_lnorm=False, init_std=0.02,
                 layer_norm_epsilon=1e-5, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.d_inner = int(d_model), int(d_inner)
        self.dropout = float(dropout)
        self.pre_lnorm = bool(pre_lnorm)
        self.init_std = float(init_std)
        self.layer_norm_epsilon = float(layer_norm_epsilon)

    def build(self, hidden_shape):
        init = keras.initializers.RandomNormal(stddev=self.init_std)
        policy = self.dtype_policy
        self.inner = keras.layers.Dense(self.d_inner, activation="relu", kernel_initializer=init,
                                        name="inner", dtype=policy)
        self.outer = keras.layers.Dense(self.d_model, kernel_initializer=init, name="outer",
                                        dtype=policy)
        self.layer_norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, name="layer_norm", dtype=policy)
        self.inner_dropout = keras.layers.Dropout(self.dropout, name="inner_dropout")
        self.output_dropout = keras.layers.Dropout(self.dropout, name="output_dropout")
        self.inner.build(hidden_shape)
        self.outer.build((*hidden_shape[:-1], self.d_inner))
        self.layer_norm.build(hidden_shape)

    def call(self, hidden, training=None):
        x = self.layer_norm(hidden) if self.pre_lnorm else hidden
        x = fast_dropout(self.inner(x), self.inner_dropout, training=training)
        x = fast_dropout(self.outer(x), self.output_dropout, training=training)
        return hidden + x if self.pre_lnorm else self.layer_norm(hidden + x)

    def compute_output_shape(self, hidden_shape):
        return hidden_shape

    def get_config(self):
        return {
            **super().get_config(), "d_model": self.d_model, "d_inner": self.d_inner,
            "dropout": self.dropout, "pre_lnorm": self.pre_lnorm, "init_std": self.init_std,
            "layer_norm_epsilon": self.layer_norm_epsilon,
        }
