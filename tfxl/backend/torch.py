"""PyTorch's answers to the model code's backend questions (`tfxl.backend.current()`): eager,
checks where values are concrete (eager_checks.py), and Keras' "uint32" stored as int64."""

import functools

import torch
from keras import ops

from tfxl.backend import eager_checks
from tfxl.backend.eager_checks import (SPARSE_TAIL, VARIABLES_ARE_TRACKABLE, checked_rows,
                                       hub_generate_function, kth_largest, positive_length,
                                       target_log_probs)

_LOW_32_BITS = 0xFFFFFFFF


def is_concrete(x):
    return not torch.compiler.is_compiling()


def wrapped_uint32(h):
    """`h` modulo 2^32: PyTorch has no uint32, Keras stores its "uint32" as int64, so sums and
    products keep bits above the 32nd (tfxl/layers/counter_hash.py)."""
    import numpy as np
    return ops.bitwise_and(h, ops.convert_to_tensor(np.uint32(_LOW_32_BITS), dtype="uint32"))


checked_finite = functools.partial(eager_checks.checked_finite, is_concrete=is_concrete)
raise_if_any = functools.partial(eager_checks.raise_if_any, is_concrete=is_concrete)


def compiled_generate(loop, model):
    """`loop` eagerly, without autograd's bookkeeping."""
    del model

    def without_autograd(*args):
        with torch.no_grad():
            return loop(*args)
    return without_autograd


__all__ = ["VARIABLES_ARE_TRACKABLE", "SPARSE_TAIL", "is_concrete", "target_log_probs",
           "wrapped_uint32", "kth_largest", "positive_length", "checked_finite", "raise_if_any",
           "compiled_generate", "hub_generate_function", "checked_rows"]
