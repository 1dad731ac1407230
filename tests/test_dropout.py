"""HashDropout keeps Keras' Dropout contract."""

import numpy as np
import pytest
import tensorflow as tf

from layer_test_case import run_layer_test
from tfxl.layers import HashDropout


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_keep_rate_scale_and_identity(rate):
    layer = HashDropout(rate, seed=3)
    x = tf.ones((64, 128, 8))
    y = layer(x, training=True).numpy()
    kept = y != 0
    assert abs(kept.mean() - (1 - rate)) < 0.01
    np.testing.assert_allclose(y[kept], 1.0 / (1.0 - rate), rtol=1e-6)
    np.testing.assert_array_equal(layer(x, training=False).numpy(), x.numpy())
    # Neighbouring elements are independent: no correlation between adjacent mask bits.
    flat = kept.reshape(-1).astype(float)
    assert abs(np.corrcoef(flat[:-1], flat[1:])[0, 1]) < 0.02


def test_masks_follow_the_seed_state():
    a, b = HashDropout(0.3, seed=7), HashDropout(0.3, seed=7)
    x = tf.ones((32, 32))
    first_a, first_b = a(x, training=True).numpy(), b(x, training=True).numpy()
    np.testing.assert_array_equal(first_a, first_b)          # same seed, same mask
    assert (a(x, training=True).numpy() != first_a).any()    # the state advances per call
    restored = HashDropout(0.3, seed=0)
    restored.seed_generator.state.assign(b.seed_generator.state.value)
    np.testing.assert_array_equal(restored(x, training=True).numpy(),
                                  b(x, training=True).numpy())


def test_keras_contract():
    run_layer_test(HashDropout, dict(rate=0.25, seed=5), (np.ones((2, 5, 8), np.float32),),
                   expected_output_shape=(2, 5, 8))
