"""The one gradient clipping of both train steps (train/loop/optimization.py `clip_by_global_norm`,
keras.ops) against tf.clip_by_global_norm: the same clipped gradients and global norm, to 1e-6 in
float32, under the clip, over it, at a norm of 0 and at a norm that is not finite."""

import numpy as np
import pytest
import keras
import tensorflow as tf
from keras import ops

from tfxl.train.loop.optimization import clip_by_global_norm

pytestmark = pytest.mark.every_backend

SHAPES = [(3, 4), (5,), (2, 3, 2), ()]


def gradients(scale, special=None):
    rng = np.random.default_rng(7)
    grads = [(scale * rng.standard_normal(shape)).astype(np.float32) for shape in SHAPES]
    if special is not None:
        grads[1][2] = special
    return grads


CASES = {
    "under the clip": (gradients(0.01), 1.0),
    "over the clip": (gradients(3.0), 0.25),
    "near the clip": (gradients(1.0), 4.0),
    "zero": ([np.zeros(shape, np.float32) for shape in SHAPES], 0.25),
    "an inf gradient": (gradients(1.0, np.inf), 0.25),
    "a NaN gradient": (gradients(1.0, np.nan), 0.25),
    "squares past float32": (gradients(1e30), 0.25),
}


def assert_clips_as_tensorflow(clip, grads, clip_norm):
    """`clip(grads, clip_norm)` gives tf.clip_by_global_norm's gradients and norm (NaN where
    TensorFlow's are NaN)."""
    expected, expected_norm = tf.clip_by_global_norm([tf.constant(g) for g in grads], clip_norm)
    clipped, norm = clip([ops.convert_to_tensor(g) for g in grads], clip_norm)
    np.testing.assert_allclose(ops.convert_to_numpy(norm), expected_norm.numpy(), rtol=1e-6)
    assert len(clipped) == len(expected)
    for ours, theirs in zip(clipped, expected):
        assert keras.backend.standardize_dtype(ours.dtype) == theirs.dtype.name
        np.testing.assert_allclose(ops.convert_to_numpy(ours), theirs.numpy(), rtol=1e-6,
                                   atol=1e-6)


@pytest.mark.parametrize("case", CASES)
def test_clipping_equals_tensorflows_clip_by_global_norm(case):
    assert_clips_as_tensorflow(clip_by_global_norm, *CASES[case])


def _zero_where_not_finite(grads, clip_norm):
    """The rule without the non-finite case: a norm of inf scales every gradient by 0."""
    norm = ops.sqrt(sum(ops.sum(ops.square(g)) for g in grads))
    return [g * (clip_norm / ops.maximum(norm, clip_norm)) for g in grads], norm


def _never_clipped(grads, clip_norm):
    norm = ops.sqrt(sum(ops.sum(ops.square(g)) for g in grads))
    return list(grads), norm


def _clipped_to_its_own_norm(grads, clip_norm):
    """Each gradient clipped by its own norm rather than the global one."""
    norms = [ops.sqrt(ops.sum(ops.square(g))) for g in grads]
    return ([g * (clip_norm / ops.maximum(n, clip_norm)) for g, n in zip(grads, norms)],
            ops.sqrt(sum(n * n for n in norms)))


@pytest.mark.parametrize("broken, case", [
    (_zero_where_not_finite, "squares past float32"),
    (_never_clipped, "over the clip"),
    (_clipped_to_its_own_norm, "over the clip"),
])
def test_the_comparison_fails_for_a_broken_rule(broken, case):
    with pytest.raises(AssertionError):
        assert_clips_as_tensorflow(broken, *CASES[case])


def test_none_gradients_stay_none():
    grads = [ops.convert_to_tensor(g) for g in gradients(3.0)]
    clipped, norm = clip_by_global_norm([grads[0], None, grads[1]], 0.25)
    assert clipped[1] is None
    numpy_grads = gradients(3.0)
    _, expected_norm = tf.clip_by_global_norm([numpy_grads[0], None, numpy_grads[1]], 0.25)
    np.testing.assert_allclose(ops.convert_to_numpy(norm), expected_norm.numpy(), rtol=1e-6)
