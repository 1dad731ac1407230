"""HashDropout keeps Keras' Dropout contract."""

import keras
import numpy as np
import pytest
from keras import ops

import backends
from backends import to_numpy
from layer_test_case import run_layer_test
from naive_reference import hash_bits
from tfxl.layers import HashDropout

pytestmark = pytest.mark.every_backend


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_keep_rate_scale_and_identity(rate):
    layer = HashDropout(rate, seed=3)
    x = ops.ones((64, 128, 8))
    y = to_numpy(layer(x, training=True))
    kept = y != 0
    assert abs(kept.mean() - (1 - rate)) < 0.01
    np.testing.assert_allclose(y[kept], 1.0 / (1.0 - rate), rtol=1e-6)
    np.testing.assert_array_equal(to_numpy(layer(x, training=False)), to_numpy(x))
    # Neighbouring elements are independent: no correlation between adjacent mask bits.
    flat = kept.reshape(-1).astype(float)
    assert abs(np.corrcoef(flat[:-1], flat[1:])[0, 1]) < 0.02


def test_masks_follow_the_seed_state():
    a, b = HashDropout(0.3, seed=7), HashDropout(0.3, seed=7)
    x = ops.ones((32, 32))
    first_a, first_b = to_numpy(a(x, training=True)), to_numpy(b(x, training=True))
    np.testing.assert_array_equal(first_a, first_b)          # same seed, same mask
    assert (to_numpy(a(x, training=True)) != first_a).any()    # the state advances per call
    restored = HashDropout(0.3, seed=0)
    restored.seed_generator.state.assign(b.seed_generator.state.value)
    np.testing.assert_array_equal(to_numpy(restored(x, training=True)),
                                  to_numpy(b(x, training=True)))


def test_keras_contract():
    run_layer_test(HashDropout, dict(rate=0.25, seed=5), (np.ones((2, 5, 8), np.float32),),
                   expected_output_shape=(2, 5, 8))


def numpy_keep_mask(shape, seed, rate):
    """Element i is kept iff its hash bits are >= rate * 2^32 (the oracle's hash)."""
    return hash_bits(shape, seed) >= np.uint32(min(round(rate * 2**32), 2**32 - 1))


@pytest.mark.parametrize("shape, rate, seed", [
    ((3, 5, 7), 0.1, 0), ((2, 64), 0.5, 12345),
    # Keras' SeedGenerator keeps its state in int32 on PyTorch: a seed >= 2^31 overflows there
    # (in Keras, before any tfxl code runs).
    pytest.param((4, 3, 2, 9), 0.9, 2**31 + 7, marks=pytest.mark.skipif(
        keras.backend.backend() == "torch", reason="Keras' int32 seed state on PyTorch"))])
def test_the_mask_is_the_documented_hash_eagerly_and_under_xla(shape, rate, seed):
    # keras.ops only: the same bits on every backend, which this pins (numpy as the oracle).
    layer = HashDropout(rate, seed=seed)
    state = to_numpy(layer.seed_generator.state).copy()
    x = ops.ones(shape)
    eager = to_numpy(layer(x, training=True))
    # Compiled as a step is (state in, state out): the second call, as eagerly.
    call = lambda trainable, non_trainable, x: layer.stateless_call(
        trainable, non_trainable, x, training=True)
    compiled = to_numpy(backends.compiled(call)(
        [v.value for v in layer.trainable_variables],
        [v.value for v in layer.non_trainable_variables], x)[0])
    for got, call in ((eager, 0), (compiled, 1)):
        seed_of_call = [int(state[0]), int(state[1]) + call]  # next() adds [0, 1] per call
        np.testing.assert_array_equal(got != 0, numpy_keep_mask(shape, seed_of_call, rate))
