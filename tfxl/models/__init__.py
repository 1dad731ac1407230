"""Transformer-XL models: the backbone and the language model."""

from tfxl.models.backbone import TransfoXLBackbone
from tfxl.models.language_model import TransfoXLLM
from tfxl.models.stateful import StatefulTransfoXLLM

__all__ = ["StatefulTransfoXLLM", "TransfoXLBackbone", "TransfoXLLM"]
