"""tfxl: Transformer-XL for TensorFlow 2 and Keras 3.

Importing tfxl has no side effects: it loads no TensorFlow and starts nothing. The names below
are imported when first used; the first model or layer name (`tfxl.TransfoXLLM`, ...) imports
tfxl.layers and tfxl.models, which registers every tfxl layer and model with Keras'
serialisation (package "tfxl"). To load a tfxl `.keras` file in a process that has not used a
tfxl model yet, `import tfxl.models` first.
"""

import importlib

__version__ = "0.1.0"

# name -> the module that defines it (imported on first use, PEP 562).
_LAZY = {
    "PRESETS": "tfxl.config", "TransfoXLConfig": "tfxl.config", "get_preset": "tfxl.config",
    **{name: "tfxl.layers" for name in (
        "AdaptiveEmbedding", "AdaptiveSoftmax", "PositionwiseFeedForward",
        "RelativeMultiHeadAttention", "RelativePositionEncoding", "TransformerXLBlock")},
    **{name: "tfxl.models" for name in (
        "LSTMLM", "StatefulTransfoXLLM", "TransfoXLBackbone", "TransfoXLLM", "TransformerLM")},
    "DocumentClassifier": "tfxl.classification",
    "BitsPerCharacter": "tfxl.metrics", "Perplexity": "tfxl.metrics",
}

__all__ = list(_LAZY)
# Subpackages and modules, imported on first attribute access too (`tfxl.data.input_fn`).
_SUBMODULES = ("analysis", "checkpoints", "classification", "cli", "config", "convert", "data",
               "files", "hub", "layers", "metrics", "model_dir", "models", "saved_model",
               "serving", "tpu", "train")


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # once
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"tfxl.{name}")
    raise AttributeError(f"module 'tfxl' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_LAZY])
