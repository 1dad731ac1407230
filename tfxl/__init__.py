"""tfxl: Transformer-XL for TensorFlow 2 and Keras 3.

Importing tfxl registers every layer and model with Keras' serialisation (package "tfxl"), so
`keras.saving.load_model` works on tfxl `.keras` files.
"""

# First, before anything loads TensorFlow: the command-line tools silence its start-up chatter.
from tfxl import cli as _cli

_cli.quiet_tensorflow_if_command_line()

from tfxl.config import PRESETS, TransfoXLConfig, get_preset
from tfxl.layers import (AdaptiveEmbedding, AdaptiveSoftmax,
                         PositionwiseFeedForward, RelativeMultiHeadAttention,
                         RelativePositionEncoding, TransformerXLBlock)
from tfxl.models import StatefulTransfoXLLM, TransfoXLBackbone, TransfoXLLM
from tfxl.metrics import BitsPerCharacter, Perplexity

__version__ = "0.1.0"

__all__ = [
    "PRESETS", "TransfoXLConfig", "get_preset", "AdaptiveEmbedding", "AdaptiveSoftmax",
    "PositionwiseFeedForward", "RelativeMultiHeadAttention", "RelativePositionEncoding",
    "TransformerXLBlock", "StatefulTransfoXLLM", "TransfoXLBackbone", "TransfoXLLM",
    "BitsPerCharacter", "Perplexity",
]
