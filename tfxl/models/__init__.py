"""Language models on every Keras backend: Transformer-XL (the backbone, the language model and
the stateful language model, whose memory is carried across `fit` batches) and the paper's
baselines, the vanilla Transformer and the LSTM (`config.architecture`)."""

from tfxl.models.backbone import TransfoXLBackbone
from tfxl.models.language_model import TransfoXLLM
from tfxl.models.lstm_lm import LSTMLM
from tfxl.models.stateful import StatefulTransfoXLLM
from tfxl.models.transformer_lm import TransformerLM

# The language model of each `TransfoXLConfig.architecture`.
LANGUAGE_MODELS = {model.architecture: model for model in (TransfoXLLM, TransformerLM, LSTMLM)}


def language_model_class(config):
    """The language model class of `config.architecture` (a config or its dict)."""
    from tfxl.models.backbone import as_config
    return LANGUAGE_MODELS[as_config(config).architecture]


def build_language_model(config, name=None, **kwargs):
    """The built language model `config` describes (any architecture); `name` and the keyword
    arguments go to its class (e.g. `dtype`)."""
    from tfxl.models.backbone import as_config
    config = as_config(config)
    model = language_model_class(config)(config, name=name, **kwargs)
    model.build((None, config.tgt_len))
    return model


__all__ = ["LANGUAGE_MODELS", "LSTMLM", "StatefulTransfoXLLM", "TransfoXLBackbone",
           "TransfoXLLM", "TransformerLM", "build_language_model", "language_model_class"]
