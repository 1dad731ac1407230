"""One Transformer-XL layer: relative attention then position-wise feed-forward.

Shape glossary: B batch, T segment length, M memory length, K = M + T, D model size, N heads,
H head size.
"""

import keras

from tfxl.layers.feed_forward import PositionwiseFeedForward
from tfxl.layers.relative_attention import RelativeMultiHeadAttention


def attention_class(name_or_cls):
    """The attention class for a registered name ("tfxl>RelativeMultiHeadAttention"), or the
    class as given."""
    if name_or_cls is None:
        return RelativeMultiHeadAttention
    if isinstance(name_or_cls, str):
        cls = keras.saving.get_registered_object(name_or_cls)
        if cls is None:
            raise ValueError(f"unknown attention class {name_or_cls!r}: register it with "
                             "keras.saving.register_keras_serializable")
        return cls
    return name_or_cls


@keras.saving.register_keras_serializable(package="tfxl")
class TransformerXLBlock(keras.layers.Layer):
    """Attention then feed-forward; the attention is pluggable, as in Model Garden's
    `TransformerScaffold`.

    Args:
      attention_cls: a `RelativeMultiHeadAttention` subclass (or its registered name) built with
        the same arguments; a new position scheme is one such class.

    Call: (hidden [B, T, D], memory, position_keys, mask [B, 1, T, K], content_bias [N, H],
    position_bias [N, H]) -> (hidden [B, T, D], what the memory's layer wrote), with memory and
    position_keys as `RelativeMultiHeadAttention` takes them.
    """

    def __init__(self, d_model, n_head, d_head, d_inner, dropout=0.0, dropatt=0.0,
                 pre_lnorm=False, init_std=0.02, layer_norm_epsilon=1e-5, attention_cls=None,
                 **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.n_head, self.d_head, self.d_inner = d_model, n_head, d_head, d_inner
        self.dropout, self.dropatt, self.pre_lnorm = dropout, dropatt, pre_lnorm
        self.init_std, self.layer_norm_epsilon = init_std, layer_norm_epsilon
        self.attention_cls = attention_class(attention_cls)

    def build(self, hidden_shape):
        common = dict(dropout=self.dropout, pre_lnorm=self.pre_lnorm, init_std=self.init_std,
                      layer_norm_epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy)
        self.attention = self.attention_cls(
            self.d_model, self.n_head, self.d_head, dropatt=self.dropatt, name="attention",
            **common)
        self.feed_forward = PositionwiseFeedForward(self.d_model, self.d_inner, name="feed_forward",
                                                    **common)
        self.attention.build(hidden_shape)
        self.feed_forward.build(hidden_shape)

    def call(self, hidden, memory, position_keys, mask, content_bias, position_bias,
             training=None):
        hidden, written = self.attention(hidden, memory, position_keys, mask, content_bias,
                                         position_bias, training=training)
        return self.feed_forward(hidden, training=training), written

    def compute_output_spec(self, hidden, *args, **kwargs):
        return self.attention.compute_output_spec(hidden, *args, **kwargs)

    def get_config(self):
        return {
            **super().get_config(), "d_model": self.d_model, "n_head": self.n_head,
            "d_head": self.d_head, "d_inner": self.d_inner, "dropout": self.dropout,
            "dropatt": self.dropatt, "pre_lnorm": self.pre_lnorm, "init_std": self.init_std,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "attention_cls": keras.saving.get_registered_name(self.attention_cls),
        }
