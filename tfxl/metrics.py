"""Bits per character and perplexity as Keras metrics.

Both are the token-weighted mean negative log-likelihood (natural log) of the counted tokens,
reported as bpc = mean / ln 2 or perplexity = exp(mean): the figures `tfxl-eval` prints.

  y_true: token ids [B, T] (the next tokens).
  y_pred: either the per-token NLL [B, T] (what `StatefulTransfoXLLM.fit`/`evaluate` hand their
    compiled metrics: the adaptive softmax never builds [B, T, V] there) or log-probabilities
    [B, T, V] (`predict`'s output, any model's `log_softmax`): told apart by rank.
  sample_weight: optional [B, T] target mask (0 = not counted).
"""

import math

import keras
from keras import ops


class _MeanTokenNLL(keras.metrics.Mean):
    """Keras' weighted mean over the NLL of every counted token."""

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true, y_pred = ops.convert_to_tensor(y_true), ops.cast(y_pred, self.dtype)
        if len(y_pred.shape) == len(y_true.shape) + 1:
            ids = ops.expand_dims(ops.cast(y_true, "int32"), -1)
            y_pred = -ops.squeeze(ops.take_along_axis(y_pred, ids, axis=-1), -1)
        return super().update_state(y_pred, sample_weight=sample_weight)

    def mean_nll(self):
        return super().result()


@keras.saving.register_keras_serializable(package="tfxl")
class BitsPerCharacter(_MeanTokenNLL):
    """Mean NLL in bits: bits per character on a character-level corpus (bits per byte for
    the `bytes` tokenizer). 0 before any token is counted."""

    def __init__(self, name="bpc", dtype=None):
        super().__init__(name=name, dtype=dtype)

    def result(self):
        return self.mean_nll() / math.log(2.0)


@keras.saving.register_keras_serializable(package="tfxl")
class Perplexity(_MeanTokenNLL):
    """exp(mean NLL): the word-level figure. 1 before any token is counted."""

    def __init__(self, name="perplexity", dtype=None):
        super().__init__(name=name, dtype=dtype)

    def result(self):
        return ops.exp(self.mean_nll())
