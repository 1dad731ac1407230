"""Sinusoidal encoding of relative distances (Dai et al. 2019, section 3.3).

Shape glossary: T query (segment) length, M memory length, K = M + T key length, D model size.
"""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="tfxl")
class RelativePositionEncoding(keras.layers.Layer):
    """R for the distances K-1, K-2, ..., 0 between a query and the keys, with no trainable weights.

    Row m of the output encodes distance K-1-m, so the last row is distance 0. Distances are
    clamped to `clamp_len` (when >= 0) before encoding. Each row is concat(sin(d*f), cos(d*f)) with
    f_k = 1 / 10000^(2k/D): the halves are concatenated, not interleaved, as in the reference code,
    so that published checkpoints (whose W_k,R was trained against this layout) load unchanged.

    Call: `encoding(key_length=K)` -> [K, D] in the layer's compute dtype. K is a Python int, so
    shapes stay static for XLA, and goes by keyword (Keras takes only tensors positionally).
    `clamp_len=` overrides the configured clamp for one call.
    """

    def __init__(self, d_model, clamp_len=-1, **kwargs):
        super().__init__(**kwargs)
        if d_model % 2:
            raise ValueError(f"RelativePositionEncoding needs an even d_model, got {d_model}")
        self.d_model = int(d_model)
        self.clamp_len = int(clamp_len)

    def call(self, key_length, clamp_len=None):
        clamp_len = self.clamp_len if clamp_len is None else int(clamp_len)
        distance = ops.arange(key_length - 1, -1, -1, dtype="float32")
        if clamp_len >= 0:
            distance = ops.minimum(distance, float(clamp_len))
        exponent = ops.arange(0, self.d_model, 2, dtype="float32") / self.d_model
        inv_freq = 1.0 / (10000.0 ** exponent)
        angle = distance[:, None] * inv_freq[None, :]
        encoding = ops.concatenate([ops.sin(angle), ops.cos(angle)], axis=-1)
        return ops.cast(encoding, self.compute_dtype)

    def compute_output_shape(self, key_length):
        return (key_length, self.d_model)

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "clamp_len": self.clamp_len}
