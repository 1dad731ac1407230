"""Transformer-XL models: the backbone and the language model (every Keras backend), and the
stateful model (TensorFlow code today: imported where TensorFlow is installed)."""

from tfxl.backend import has_tensorflow
from tfxl.models.backbone import TransfoXLBackbone
from tfxl.models.language_model import TransfoXLLM

__all__ = ["TransfoXLBackbone", "TransfoXLLM"]
if has_tensorflow():  # importing it registers it for .keras files, as the others
    from tfxl.models.stateful import StatefulTransfoXLLM  # noqa: F401  (in __all__)
    __all__.append("StatefulTransfoXLLM")


def __getattr__(name):
    if name == "StatefulTransfoXLLM":  # reached only where TensorFlow is not installed
        from tfxl.backend import tensorflow
        tensorflow("tfxl.models.StatefulTransfoXLLM")
    raise AttributeError(f"module 'tfxl.models' has no attribute {name!r}")
