"""Keras 3 layers of Transformer-XL, one concept per module."""

from tfxl.layers.adaptive_clusters import Cluster, cluster_layout
from tfxl.layers.adaptive_embedding import AdaptiveEmbedding
from tfxl.layers.adaptive_softmax import AdaptiveSoftmax
from tfxl.layers.dropout import HashDropout
from tfxl.layers.feed_forward import PositionwiseFeedForward
from tfxl.layers.memory import (AttendedKeys, KeyValueMemory, KeyValueRing, LayerInputMemory,
                                PositionCache, RecentWindowMemory, attention_mask)
from tfxl.layers.relative_attention import RelativeMultiHeadAttention, rel_shift
from tfxl.layers.relative_position import RelativePositionEncoding
from tfxl.layers.transformer_xl_block import TransformerXLBlock

__all__ = [
    "AdaptiveEmbedding", "AdaptiveSoftmax", "AttendedKeys", "Cluster", "HashDropout",
    "KeyValueMemory", "KeyValueRing", "LayerInputMemory", "PositionCache",
    "PositionwiseFeedForward", "RecentWindowMemory",
    "RelativeMultiHeadAttention", "RelativePositionEncoding", "TransformerXLBlock",
    "attention_mask", "cluster_layout", "rel_shift",
]
