"""Position-wise feed-forward sub-layer with residual and LayerNorm.

Shape glossary: B batch, T segment length, D model size, F inner size (d_inner).
"""

import keras

from tfxl.layers.dropout import HashDropout


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
        self.inner_dropout = HashDropout(self.dropout, name="inner_dropout", dtype=policy)
        self.output_dropout = HashDropout(self.dropout, name="output_dropout", dtype=policy)
        self.inner.build(hidden_shape)
        self.outer.build((*hidden_shape[:-1], self.d_inner))
        self.layer_norm.build(hidden_shape)

    def call(self, hidden, training=None):
        x = self.layer_norm(hidden) if self.pre_lnorm else hidden
        x = self.inner_dropout(self.inner(x), training=training)
        x = self.output_dropout(self.outer(x), training=training)
        return hidden + x if self.pre_lnorm else self.layer_norm(hidden + x)

    def compute_output_shape(self, hidden_shape):
        return hidden_shape

    def get_config(self):
        return {
            **super().get_config(), "d_model": self.d_model, "d_inner": self.d_inner,
            "dropout": self.dropout, "pre_lnorm": self.pre_lnorm, "init_std": self.init_std,
            "layer_norm_epsilon": self.layer_norm_epsilon,
        }
