"""What a test needs to run on every Keras backend: values as numpy, a compiled call, gradients.

The suite runs on TensorFlow; `make test` runs the test modules marked `every_backend` again
under `KERAS_BACKEND=jax` (tests/conftest.py deselects the others there, and the tests of such a
module marked `tensorflow_only`). The helpers below are what those modules use in place of
`tf.function`, `tf.GradientTape` and `.numpy()`.
"""

import keras
import numpy as np

BACKEND = keras.backend.backend()

# XLA's settings for a test process on JAX (tests/conftest.py sets them, unless XLA_FLAGS is
# already set): JAX compiles each eager op of a test on its own, and these roughly halve that
# compile time (XLA's CPU backend at -O0, and its older loop emitters instead of the fusion
# emitters), which dominates the JAX pass.
JAX_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"

# Run first in a child process (or as its sitecustomize): TensorFlow is then absent there as
# where it is not installed. `import tensorflow` raises ImportError, and
# `importlib.util.find_spec` answers None (what tfxl.backend.has_tensorflow, PyTorch's and
# transformers' import probes ask).
WITHOUT_TENSORFLOW = """
import sys
for name in ("tensorflow", "tensorflow_text", "tf_keras"):
    sys.modules[name] = None
import importlib.util
assert importlib.util.find_spec("tensorflow") is None
"""


def to_numpy(x):
    """A tensor of any backend (or a numpy array) as a numpy array."""
    return np.asarray(keras.ops.convert_to_numpy(x))


def compiled(fn):
    """`fn` compiled as the backend compiles a step: XLA on TensorFlow and JAX; PyTorch eager
    (torch.compile is not what a PyTorch step of tfxl's relies on)."""
    if BACKEND == "tensorflow":
        import tensorflow as tf
        return tf.function(fn, jit_compile=True)
    if BACKEND == "jax":
        import jax
        return jax.jit(fn)
    return fn


def value_and_gradients(loss_fn, variables):
    """(loss_fn(), d loss / d variable for each of `variables`), as numpy; None where the loss
    does not depend on a variable (TensorFlow and PyTorch say so; JAX gives zeros)."""
    if BACKEND == "tensorflow":
        import tensorflow as tf
        with tf.GradientTape() as tape:
            loss = loss_fn()
        grads = tape.gradient(loss, [v.value for v in variables])
    elif BACKEND == "jax":
        import jax

        def stateless(values):
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                return loss_fn()
        loss, grads = jax.value_and_grad(stateless)([v.value for v in variables])
    else:
        for v in variables:
            v.value.grad = None
        loss = loss_fn()
        loss.backward()
        grads = [v.value.grad for v in variables]
    return to_numpy(loss), [None if g is None else to_numpy(g) for g in grads]
