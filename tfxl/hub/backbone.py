"""The keras-hub backbone of Transformer-XL: tfxl's language model behind keras-hub's interface.

Shape glossary: B batch, S sequence length (keras-hub pads every prompt to it), D model size.
"""

import keras
from keras_hub.models import Backbone

from tfxl.config import TransfoXLConfig
from tfxl.hub.presets import save_preset
from tfxl.models import TransfoXLLM


@keras.saving.register_keras_serializable(package="tfxl")
class TransfoXLHubBackbone(Backbone):
    """A keras-hub `Backbone` holding a `tfxl.models.TransfoXLLM` (adaptive softmax included).

    As a functional model it maps {"token_ids": int [B, S], "padding_mask": [B, S]} to the last
    hidden states [B, S, D] of one segment read on an empty memory (the training settings of the
    config: mem_len, clamp_len, same_length). `language_model` is the whole tfxl model: the task
    reads its log-probabilities and generation steps it on a key/value cache
    (`TransfoXLCausalLM`). Its weights are the backbone's, so `save_to_preset` writes them all to
    model.weights.h5 (the task has no weights of its own).

    Args:
      config: a `tfxl.config.TransfoXLConfig` or its dict (what `get_config` stores).
      attention_cls: registered name of the attention class (default: tfxl's relative attention).
      dtype: the dtype policy of every layer.
    """

    def __init__(self, config, attention_cls=None, dtype=None, **kwargs):
        config = config if isinstance(config, TransfoXLConfig) else TransfoXLConfig.from_dict(
            config)
        # === Layers ===
        self.language_model = TransfoXLLM(config, attention_cls=attention_cls, dtype=dtype,
                                          name="language_model")
        self.language_model.build((None, None))
        # === Functional model ===
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        padding_mask = keras.Input(shape=(None,), dtype="int32", name="padding_mask")
        hidden, _ = self.language_model.backbone(
            token_ids, segment_valid=keras.ops.cast(padding_mask, "bool"))
        super().__init__(inputs={"token_ids": token_ids, "padding_mask": padding_mask},
                         outputs=hidden, dtype=dtype, **kwargs)
        # === Config ===
        self.config = config
        self.attention_cls = self.language_model.attention_cls

    @property
    def vocabulary_size(self):
        return self.config.vocab_size

    def save_to_preset(self, preset_dir, max_shard_size=10):
        """keras-hub's `save_to_preset`, into a local directory or a bucket
        (`tfxl.hub.presets`)."""
        save_preset(super().save_to_preset, preset_dir, max_shard_size=max_shard_size)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict(),
                "attention_cls": keras.saving.get_registered_name(self.attention_cls)}
