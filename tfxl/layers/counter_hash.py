"""A counter-based random stream: uniform bits as a keyed integer hash of each element's index.

Why a hash rather than a backend's generator: the same (seed, shape) gives the same bits on
TensorFlow, JAX and PyTorch (uint32 xor-shift / multiply rounds, whose products wrap modulo 2^32
on every backend), and XLA vectorises it (TensorFlow's stateless Philox lowers to scalar CPU
code, ~20-300 ns per element, against ~0.5 ns here; BENCHMARKS.md). `HashDropout`'s masks and
the sampler's draws (`tfxl.models.sampling`) and generation's per-token seeds
(`tfxl.models.generation.token_seed`) are this stream and its uint32 arithmetic.

PyTorch has no uint32: Keras stores its "uint32" as int64 there, so sums and products keep bits
above the 32nd, and a negative int32 cast to it stays negative. `wrapped` clears those bits (a
no-op where uint32 is 32 bits: TensorFlow, JAX), which makes every result the same modulo 2^32
on every backend: the low 32 bits of an int64 product are those of the uint32 product.
"""

import numpy as np
from keras import ops

from tfxl import backend

_GOLDEN = 0x9E3779B9


def constant(value):
    """`value` (0 <= value < 2^32) as a uint32 tensor. From a numpy uint32: one constant in a
    traced graph, where a Python int gave an int32/int64 constant and a Cast (23 Casts of a
    dropout mask's 110 graph ops)."""
    return ops.convert_to_tensor(np.uint32(value), dtype="uint32")


def wrapped(h):
    """`h` (Keras "uint32") modulo 2^32: the bits a 32-bit uint32 would hold."""
    return backend.current().wrapped_uint32(h)  # int64 in uint32's place on PyTorch


def as_uint32(x):
    """Integers `x` (e.g. int32 seeds) as uint32, modulo 2^32 (two's complement for negatives)."""
    return wrapped(ops.cast(x, "uint32"))


def as_int32(h):
    """uint32 `h` as the int32 of the same 32 bits (values >= 2^31 negative): a cast, which wraps
    on every backend (Keras' cast is a C-style conversion, XLA's convert, PyTorch's `to`)."""
    return ops.cast(h, "int32")


def _mix32(h):
    """A 32-bit integer finaliser (lowbias32): xor-shift / multiply rounds, all uint32 ops."""
    h = ops.bitwise_xor(h, ops.right_shift(h, constant(16)))
    h = wrapped(h * constant(0x7FEB352D))
    h = ops.bitwise_xor(h, ops.right_shift(h, constant(15)))
    h = wrapped(h * constant(0x846CA68B))
    return ops.bitwise_xor(h, ops.right_shift(h, constant(16)))


def hash_bits(shape, seed):
    """uint32 `shape`: element i (row-major index) is mix(mix(i ^ key1) + key2), the keys from
    `seed` (2 integers, taken modulo 2^32)."""
    seed = as_uint32(seed)
    key1 = _mix32(wrapped(seed[0] * constant(_GOLDEN) + seed[1]))
    key2 = _mix32(wrapped(key1 + seed[1] * constant(0x85EBCA6B) + constant(1)))
    size = 1
    for dim in shape:
        size = size * dim
    index = ops.reshape(ops.cast(ops.arange(size, dtype="int32"), "uint32"), shape)
    return _mix32(wrapped(_mix32(ops.bitwise_xor(index, key1)) + key2))


def uniform(shape, seed):
    """float32 `shape` in (0, 1): the top 24 of each element's `hash_bits`, centred in its bin
    (never 0 or 1, so that log(-log(u)) is finite)."""
    top = ops.cast(ops.right_shift(hash_bits(shape, seed), constant(8)), "float32")
    return (top + 0.5) * (1.0 / 2**24)
