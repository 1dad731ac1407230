"""JAX's answers to the model code's backend questions (`tfxl.backend.current()`): static
shapes, checks where values are concrete (eager_checks.py), loops under `jax.jit`."""

import functools

import jax
import keras

from tfxl.backend import eager_checks
from tfxl.backend.eager_checks import (SPARSE_TAIL, VARIABLES_ARE_TRACKABLE, checked_rows,
                                       hub_generate_function, kth_largest, positive_length,
                                       target_log_probs)


def is_concrete(x):
    return not isinstance(x, jax.core.Tracer)


def wrapped_uint32(h):
    """uint32 is 32 bits here: products already wrap modulo 2^32."""
    return h


checked_finite = functools.partial(eager_checks.checked_finite, is_concrete=is_concrete)
raise_if_any = functools.partial(eager_checks.raise_if_any, is_concrete=is_concrete)


def compiled_generate(loop, model):
    """`loop(ids, n, ...)` under `jax.jit` with n static (one compile per batch, prompt length
    and n) and the model's variables as arguments, so that it always reads the current
    weights."""
    def stateless(values, ids, n, *sampling):
        with keras.StatelessScope(state_mapping=list(zip(model.variables, values))):
            return loop(ids, n, *sampling)
    jitted = jax.jit(stateless, static_argnums=2)
    return lambda ids, n, *sampling: jitted([v.value for v in model.variables], ids, n,
                                            *sampling)


__all__ = ["VARIABLES_ARE_TRACKABLE", "SPARSE_TAIL", "is_concrete", "target_log_probs",
           "wrapped_uint32", "kth_largest", "positive_length", "checked_finite", "raise_if_any",
           "compiled_generate", "hub_generate_function", "checked_rows"]
