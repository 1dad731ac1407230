"""tfxl: Transformer-XL for TensorFlow 2 and Keras 3."""

__version__ = "0.1.0"
