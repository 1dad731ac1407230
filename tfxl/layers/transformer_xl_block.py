"""One Transformer-XL layer: relative attention then position-wise feed-forward.

Shape glossary: B batch, T segment length, M memory length, K = M + T, D model size, N heads,
H head size.
"""

import keras

from tfxl.layers.feed_forward import PositionwiseFeedForward
from tfxl.layers.relative_attention import RelativeMultiHeadAttention


@keras.saving.register_keras_serializable(package="tfxl")
class TransformerXLBlock(keras.layers.Layer):
    """Call: (hidden [B, T, D], memory_state [B, M, D], position_encoding [K, D],
    mask [B, 1, T, K], content_bias [N, H], position_bias [N, H]) -> [B, T, D]."""

    def __init__(self, d_model, n_head, d_head, d_inner, dropout=0.0, dropatt=0.0,
                 pre_lnorm=False, init_std=0.02, layer_norm_epsilon=1e-5, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.n_head, self.d_head, self.d_inner = d_model, n_head, d_head, d_inner
        self.dropout, self.dropatt, self.pre_lnorm = dropout, dropatt, pre_lnorm
        self.init_std, self.layer_norm_epsilon = init_std, layer_norm_epsilon

    def build(self, hidden_shape):
        common = dict(dropout=self.dropout, pre_lnorm=self.pre_lnorm, init_std=self.init_std,
                      layer_norm_epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy)
        self.attention = RelativeMultiHeadAttention(
            self.d_model, self.n_head, self.d_head, dropatt=self.dropatt, name="attention",
            **common)
        self.feed_forward = PositionwiseFeedForward(self.d_model, self.d_inner, name="feed_forward",
                                                    **common)
        self.attention.build(hidden_shape)
        self.feed_forward.build(hidden_shape)

    def call(self, hidden, memory_state, position_encoding, mask, content_bias, position_bias,
             training=None):
        hidden = self.attention(hidden, memory_state, position_encoding, mask, content_bias,
                                position_bias, training=training)
        return self.feed_forward(hidden, training=training)

    def compute_output_shape(self, hidden_shape, *args, **kwargs):
        return hidden_shape

    def get_config(self):
        return {
            **super().get_config(), "d_model": self.d_model, "n_head": self.n_head,
            "d_head": self.d_head, "d_inner": self.d_inner, "dropout": self.dropout,
            "dropatt": self.dropatt, "pre_lnorm": self.pre_lnorm, "init_std": self.init_std,
            "layer_norm_epsilon": self.layer_norm_epsilon,
        }
