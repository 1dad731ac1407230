"""The model code's seam between Keras backends: one module per backend, and `current()`, the one
place that picks between them.

The layers and models are `keras.ops` and run on TensorFlow, JAX and PyTorch. What has no
`keras.ops` answer is asked of `current()`, the running backend's module (tensorflow.py, jax.py,
torch.py), which each answer the same questions: whether a tensor holds values now
(`is_concrete`), the kernels a backend keeps its own op for (a batched gather, a top-k of a
traced k), how a check reaches the user (an in-graph assertion, or a ValueError where the values
are concrete), how a loop is compiled, and whether Keras variables are TensorFlow trackables
(the checkpoint format). Model code never asks which backend runs: the training run's seam is
tfxl/train/backends/. Each backend's library is imported only where that backend runs.

The model features that are TensorFlow code import it through `require_tensorflow(feature)`,
which names the feature where TensorFlow is missing; a tool that is TensorFlow code refuses another
backend with `check_tensorflow_tool`.
"""

import importlib
import importlib.util

from tfxl.deferred import deferred_import

# Deferred: checkpoint and flag modules import this module at their top, and a tool's --help
# must not load Keras.
keras = deferred_import("keras")

MODULES = {"tensorflow": "tfxl.backend.tensorflow", "jax": "tfxl.backend.jax",
           "torch": "tfxl.backend.torch"}


def backend_name():
    """The backend Keras runs on: "tensorflow", "jax" or "torch" (KERAS_BACKEND)."""
    return keras.backend.backend()


def current():
    """The running backend's module of this package: the one place that picks between them."""
    name = backend_name()
    if name not in MODULES:
        raise RuntimeError(f"tfxl runs on TensorFlow, JAX or PyTorch; Keras runs on {name}")
    return importlib.import_module(MODULES[name])


def is_concrete(x):
    """Whether `x` holds values now (an eager call), rather than standing for values while a
    function is traced (`tf.function`, `jax.jit`, `torch.compile`) or a Keras functional model
    is built. Python may read the values of a concrete tensor only."""
    if isinstance(x, keras.KerasTensor):
        return False
    return current().is_concrete(x)


def require_tensorflow(feature):
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


def check_tensorflow_tool(error=RuntimeError):
    """Raises `error` unless Keras runs on TensorFlow: for a tool that is TensorFlow code (every
    tool but tfxl-train, which also trains on JAX)."""
    if backend_name() != "tensorflow":
        raise error(f"this tool runs on TensorFlow, and Keras runs on {backend_name()} here "
                    "(KERAS_BACKEND): unset it (tfxl-train is the tool that also trains on JAX)")
