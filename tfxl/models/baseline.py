"""What the paper's baselines share (tfxl/models/transformer_lm.py, tfxl/models/lstm_lm.py): the
adaptive embedding and softmax of Transformer-XL, the (de)serialisation, and the members the
trainer, the evaluator and `score_document` ask every language model for.

The call contract is `TransfoXLLM`'s: `call(token_ids, memory=None, reset=None, targets=None,
training=None, ...)` returns (nll [B, T] float32 when `targets` is given, else log_probs
[B, T, V] float32; the new memory), and `init_memory(batch)` (training) and
`init_key_value_ring(batch, tgt_len, mem_len)` (evaluation) give the memories a caller carries.
Transformer-XL's other inference arguments (clamp_len, same_length, position_keys) are taken
and mean nothing here: `position_keys()` precomputes nothing (an empty tuple).

Shape glossary: B batch, T segment length, V vocabulary size, D model size.
"""

import keras
from keras import ops

from tfxl.config import TransfoXLConfig
from tfxl.layers.adaptive_embedding import AdaptiveEmbedding
from tfxl.layers.adaptive_softmax import AdaptiveSoftmax
from tfxl.models.backbone import as_config, default_name


def sinusoid(positions, d_model, dtype):
    """The absolute position encoding of Vaswani et al. 2017, [..., D] for int `positions`
    [...]: concat(sin(p f), cos(p f)) with f_k = 1 / 10000^(2k/D), the halves concatenated as
    tfxl's relative encoding lays them out (tfxl/layers/relative_position.py)."""
    exponent = ops.arange(0, d_model, 2, dtype="float32") / d_model
    angle = ops.cast(positions, "float32")[..., None] * (1.0 / (10000.0 ** exponent))
    return ops.cast(ops.concatenate([ops.sin(angle), ops.cos(angle)], axis=-1), dtype)


class BaselineLM(keras.Model):
    """A baseline language model of `config` (its `architecture` must be the class's).

    Subclasses build their layers between the embedding and the softmax (`build_layers`) and
    define `call`, `init_memory` and `init_key_value_ring`.
    """

    architecture = None  # the config's architecture a subclass reads
    default_name = None

    def __init__(self, config, name=None, **kwargs):
        super().__init__(name=name or default_name(self.default_name), **kwargs)
        self.config = as_config(config)
        if self.config.architecture != self.architecture:
            raise ValueError(f"{type(self).__name__} is the {self.architecture!r} architecture; "
                             f"config.architecture is {self.config.architecture!r} (build it "
                             "with tfxl.models.build_language_model)")
        self.build((None, None))  # no weight's shape depends on the input

    def build(self, ids_shape=None):
        if self.built:
            return
        c = self.config
        self.embedding = AdaptiveEmbedding(
            c.vocab_size, c.embed_dim, c.d_model, c.cutoffs, c.div_val, c.proj_same_dim,
            c.init_std, c.proj_init_std, name="embedding", dtype=self.dtype_policy)
        self.embedding.build(ids_shape)
        self.build_layers()
        self.softmax = AdaptiveSoftmax(
            c.vocab_size, c.embed_dim, c.d_model, c.cutoffs, c.div_val, c.proj_same_dim,
            c.tie_weight, c.cluster_tie_projs, c.init_std, c.proj_init_std, name="softmax",
            dtype=self.dtype_policy)
        self.softmax.build((None, None, c.d_model))

    def build_layers(self):
        raise NotImplementedError

    def head(self, hidden, targets=None):
        """The adaptive softmax on hidden states [B, T, D], tied to the embedding as the config
        says (as `TransfoXLLM.head`): nll [B, T] of `targets`, else log_probs [B, T, V]."""
        n = len(self.embedding.clusters)
        weights = ([self.embedding.cluster_weight(i) for i in range(n)]
                   if self.config.tie_weight else None)
        projections = [self.embedding.cluster_projection(i) for i in range(n)]
        return self.softmax(hidden, targets, tied_weights=weights,
                            tied_projections=projections)

    def position_keys(self, key_length=None, clamp_len=None):
        """Nothing: a baseline precomputes nothing per evaluation pass (the evaluator and
        `score_document` pass this back as `position_keys=`, which is ignored)."""
        del key_length, clamp_len
        return ()

    @classmethod
    def get_layout_map(cls, config, device_mesh, *, model_dim="model"):
        """An empty `keras.distribution.LayoutMap`: under JAX's model_parallel every weight of a
        baseline is replicated (the models are small; the batch is still split)."""
        del config, model_dim
        return keras.distribution.LayoutMap(device_mesh)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        model_config = TransfoXLConfig.from_dict(config.pop("config"))
        return cls(model_config, **config)
