"""What tfxl's model code needs to know about the Keras backend it runs on, in one place.

The layers and models are `keras.ops` and run on TensorFlow, JAX and PyTorch. Two questions have
no `keras.ops` answer: which backend runs (`is_tensorflow`, for the few paths that keep a
TensorFlow-only op because it is faster there), and whether a tensor holds values now or is a
placeholder being traced (`is_concrete`, for checks that read values in Python). Each backend's
own module is imported only when that backend is the one running.
"""

import keras


def is_tensorflow():
    """Whether Keras runs on TensorFlow."""
    return keras.backend.backend() == "tensorflow"


def is_concrete(x):
    """Whether `x` holds values now (an eager call), rather than standing for values while a
    function is traced (`tf.function`, `jax.jit`, `torch.compile`) or a Keras functional model
    is built. Python may read the values of a concrete tensor only."""
    if isinstance(x, keras.KerasTensor):
        return False
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf
        return tf.executing_eagerly()
    if backend == "jax":
        import jax
        return not isinstance(x, jax.core.Tracer)
    if backend == "torch":
        import torch
        return not torch.compiler.is_compiling()
    return True
