"""Transformer-XL for keras-hub (the `hub` extra): `TransfoXLCausalLM` with its backbone,
preprocessor and tokenizer, converters from a trained tfxl model, and `TransfoXLTextClassifier`
(documents of any length, from a language model's preset).

    from tfxl.hub import causal_lm_from_model_dir
    causal_lm = causal_lm_from_model_dir("runs/tiny", "data/tiny", sequence_length=128)
    causal_lm.compile(sampler="greedy")
    causal_lm.generate("def main(", max_length=64)
    causal_lm.save_to_preset("presets/tiny")       # later: TransfoXLCausalLM.from_preset(...)

The rest of tfxl never imports this package, so tfxl works without keras-hub installed.
"""

try:
    import keras_hub  # noqa: F401 (imported only to fail early with the install hint)
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError("tfxl.hub needs keras-hub: pip install '.[hub]' in a clone of tfxl") from err

from tfxl.hub.backbone import TransfoXLHubBackbone
from tfxl.hub.causal_lm import TransfoXLCausalLM
from tfxl.hub.convert import causal_lm_from_model, causal_lm_from_model_dir
from tfxl.hub.preprocessor import TransfoXLCausalLMPreprocessor
from tfxl.hub.text_classifier import TransfoXLTextClassifier, TransfoXLTextClassifierPreprocessor
from tfxl.hub.tokenizer import TransfoXLTokenizer

__all__ = ["TransfoXLCausalLM", "TransfoXLCausalLMPreprocessor", "TransfoXLHubBackbone",
           "TransfoXLTextClassifier", "TransfoXLTextClassifierPreprocessor",
           "TransfoXLTokenizer", "causal_lm_from_model", "causal_lm_from_model_dir"]
