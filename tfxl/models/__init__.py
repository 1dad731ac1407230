"""Transformer-XL models on every Keras backend: the backbone, the language model and the
stateful language model (memory carried across `fit` batches)."""

from tfxl.models.backbone import TransfoXLBackbone
from tfxl.models.language_model import TransfoXLLM
from tfxl.models.stateful import StatefulTransfoXLLM

__all__ = ["StatefulTransfoXLLM", "TransfoXLBackbone", "TransfoXLLM"]
