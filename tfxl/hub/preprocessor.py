"""`TransfoXLCausalLMPreprocessor`: text to the {"token_ids", "padding_mask"} a
`TransfoXLCausalLM` reads, and generated ids back to text."""

import keras
from keras_hub.models import CausalLMPreprocessor

from tfxl.hub.backbone import TransfoXLHubBackbone
from tfxl.hub.tokenizer import TransfoXLTokenizer


@keras.saving.register_keras_serializable(package="tfxl")
class TransfoXLCausalLMPreprocessor(CausalLMPreprocessor):
    """keras-hub's causal-LM preprocessing with a `TransfoXLTokenizer`.

    Start and end tokens are both tfxl's `<eod>`, the token every document begins with in
    tfxl's data (and the next one's start ends it): with `add_start_token` (the default) a prompt
    is read as the beginning of a document, as in training; `tfxl-generate` reads the prompt as
    given, which `add_start_token=False` reproduces. `generate` stops when every row has begun a
    new document (`<eod>`), unless called with `stop_token_ids=None`.
    """

    backbone_cls = TransfoXLHubBackbone
    tokenizer_cls = TransfoXLTokenizer
