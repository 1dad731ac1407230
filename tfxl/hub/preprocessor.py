"""`TransfoXLCausalLMPreprocessor`: text to the {"token_ids", "padding_mask"} a
`TransfoXLCausalLM` reads, and generated ids back to text."""

import keras
from keras_hub.models import CausalLMPreprocessor

from tfxl.hub.backbone import TransfoXLHubBackbone
from tfxl.hub.presets import save_preset
from tfxl.hub.tokenizer import TransfoXLTokenizer


@keras.saving.register_keras_serializable(package="tfxl")
class TransfoXLCausalLMPreprocessor(CausalLMPreprocessor):
    """keras-hub's causal-LM preprocessing with a `TransfoXLTokenizer`.

    Start and end tokens are both tfxl's `<eod>`, the token every document begins with in
    tfxl's data (the next document's `<eod>` ends the one before). keras-hub's
    `generate_preprocess` always puts the start token before a prompt, so `generate("text")`
    reads the prompt as the beginning of a document, as in training (`tfxl-generate` reads the
    prompt as given: pass token ids without a preprocessor for that). `add_start_token` and
    `add_end_token` apply to training inputs. `generate` stops when every row has begun a new
    document (`<eod>`), unless called with `stop_token_ids=None`.
    """

    backbone_cls = TransfoXLHubBackbone
    tokenizer_cls = TransfoXLTokenizer

    def save_to_preset(self, preset_dir):
        """keras-hub's `save_to_preset`, into a local directory or a bucket
        (`tfxl.hub.presets`)."""
        save_preset(super().save_to_preset, preset_dir)
