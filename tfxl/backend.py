"""What tfxl's model code needs to know about the Keras backend it runs on, in one place.

The layers and models are `keras.ops` and run on TensorFlow, JAX and PyTorch. Two questions have
no `keras.ops` answer: which backend runs (`backend_name`, `is_tensorflow`, `is_torch`, for the
few paths that keep a backend's own op or work around one), and whether a tensor holds values
now or is a placeholder being traced (`is_concrete`, for checks that read values in Python).
Each backend's own module is imported only when that backend is the one running. The model
features that are TensorFlow code import it through `tensorflow(feature)`, which names the
feature where TensorFlow is missing; a tool that is TensorFlow code refuses another backend
with `check_tensorflow_tool`.
"""

import importlib.util

from tfxl.deferred import deferred_import

# Deferred: checkpoint and flag modules ask this module at their top, and a tool's --help must
# not load Keras.
keras = deferred_import("keras")


def tensorflow(feature):
    """TensorFlow, imported for `feature` (something tfxl has only in TensorFlow); where it is
    not installed, an ImportError that names the feature."""
    try:
        import tensorflow as tf
    except ImportError as error:
        raise ImportError(f"{feature} needs TensorFlow, which is not installed (pip install "
                          "tensorflow); tfxl's layers and the models' forward pass do not "
                          "(README, \"Backends\")") from error
    return tf


def has_tensorflow():
    """Whether TensorFlow can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec("tensorflow") is not None
    except ImportError:  # a finder that refuses it (as tests/test_backends.py's does)
        return False


def backend_name():
    """The backend Keras runs on: "tensorflow", "jax" or "torch" (KERAS_BACKEND)."""
    return keras.backend.backend()


def is_tensorflow():
    """Whether Keras runs on TensorFlow."""
    return backend_name() == "tensorflow"


def is_torch():
    """Whether Keras runs on PyTorch."""
    return backend_name() == "torch"


def check_tensorflow_tool(error=RuntimeError):
    """Raises `error` unless Keras runs on TensorFlow: for a tool that is TensorFlow code (every
    tool but tfxl-train, which also trains on JAX)."""
    if not is_tensorflow():
        raise error(f"this tool runs on TensorFlow, and Keras runs on {backend_name()} here "
                    "(KERAS_BACKEND): unset it (tfxl-train is the tool that also trains on JAX)")


def is_concrete(x):
    """Whether `x` holds values now (an eager call), rather than standing for values while a
    function is traced (`tf.function`, `jax.jit`, `torch.compile`) or a Keras functional model
    is built. Python may read the values of a concrete tensor only."""
    if isinstance(x, keras.KerasTensor):
        return False
    backend = backend_name()
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
