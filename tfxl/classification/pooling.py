"""What a document classifier pools from what the backbone has read.

Shape glossary: B batch (documents), T segment length, S segments read, D model size.

Every pooling sees only valid positions: `valid` masks are False at padding, and a segment
without a valid token has no summary (`summary_valid` False). A document without a token pools to
zeros.
"""

import keras
from keras import ops

# The poolings' names live where the tools' flags take them from.
from tfxl.classification.readings import POOLINGS


def check_pooling(pooling):
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
    return pooling


def valid_mean(hidden, valid):
    """The mean of hidden [B, T, D] over the positions where valid [B, T] is True: [B, D], and
    whether there was one ([B] bool)."""
    weights = ops.cast(valid, hidden.dtype)[:, :, None]
    count = ops.sum(weights, axis=1)
    return ops.sum(hidden * weights, axis=1) / ops.maximum(count, 1.0), count[:, 0] > 0


def last_valid_state(hidden, valid):
    """hidden [B, T, D] at each row's last valid position (valid [B, T] is a prefix: the
    document's last segment, padded on the right); zeros for a row without one."""
    count = ops.sum(ops.cast(valid, "int32"), axis=1)
    index = ops.maximum(count - 1, 0)[:, None, None]
    state = ops.take_along_axis(hidden, index, axis=1)[:, 0]
    return ops.where((count > 0)[:, None], state, ops.zeros((), hidden.dtype))


@keras.saving.register_keras_serializable(package="tfxl")
class SegmentAttentionPooling(keras.layers.Layer):
    """Attention of one learned query over per-segment summaries.

    Call: (summaries [B, S, D], summary_valid [B, S] bool) -> [B, D]: the softmax over the valid
    summaries of (summary . query) / sqrt(D), weighting the summaries. Segments without a valid
    token get no weight; so a document padded with empty segments pools the same.
    """

    def __init__(self, init_std=0.02, **kwargs):
        super().__init__(**kwargs)
        self.init_std = float(init_std)

    def build(self, summaries_shape, summary_valid_shape=None):
        self.query = self.add_weight(
            name="query", shape=(summaries_shape[-1],),
            initializer=keras.initializers.RandomNormal(stddev=self.init_std))

    def call(self, summaries, summary_valid):
        scale = 1.0 / float(summaries.shape[-1]) ** 0.5
        score = ops.cast(ops.einsum("bsd,d->bs", summaries, ops.cast(self.query, summaries.dtype)),
                         "float32") * scale
        # Softmax in float32: the mask value below is representable, as in the attention.
        score = ops.where(summary_valid, score, -1e30)
        if summaries.shape[1] == 1:
            # One segment (a truncated reading): the softmax is 1, and Keras warns about a
            # softmax over an axis of size 1 on every trace. The score stays on the path with
            # weight 0: the query's gradient is zero, as the softmax's would be, not None (which
            # stops a GradientTape step and makes Keras `fit` warn).
            weights = ops.ones_like(score) + 0.0 * score
        else:
            weights = ops.softmax(score, axis=-1)
        weights = ops.where(summary_valid, weights, 0.0)  # a row with no summary: all zero
        return ops.einsum("bs,bsd->bd", ops.cast(weights, summaries.dtype), summaries)

    def compute_output_shape(self, summaries_shape, summary_valid_shape=None):
        return (summaries_shape[0], summaries_shape[-1])

    def get_config(self):
        return {**super().get_config(), "init_std": self.init_std}
