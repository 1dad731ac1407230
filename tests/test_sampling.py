"""The sampler (tfxl.models.sampling.sample_next) on every backend: its filters, its seeds, and
its draws, token for token those of an independent numpy Gumbel-max over the counter-hash
stream (tests/naive_reference.py), so that a seed gives the same tokens on every backend."""

import numpy as np
import pytest
from keras import ops

from backends import compiled, to_numpy
from naive_reference import gumbel_max_draw
from tfxl.models.sampling import sample_next

pytestmark = pytest.mark.every_backend

PROBS = [0.5, 0.3, 0.15, 0.05]


def draws(temperature, top_k, top_p, seed, rows=256):
    log_probs = ops.log(ops.convert_to_tensor([PROBS] * rows))
    return to_numpy(sample_next(log_probs, temperature, top_k, top_p,
                                ops.convert_to_tensor(seed, "int32")))


def test_filters_and_seeds():
    assert set(draws(0.0, 0, 1.0, [1, 2])) == {0}                    # greedy
    assert set(draws(1.0, 1, 1.0, [1, 2])) == {0}                    # top-1
    assert set(draws(1.0, 2, 1.0, [1, 2])) == {0, 1}
    assert set(draws(1.0, 0, 0.7, [1, 2])) == {0, 1}  # 0.5 < 0.7 needs the second, not the third
    assert set(draws(1.0, 0, 0.0, [1, 2])) == {0}     # p <= 0: the most likely token only
    everything = draws(1.0, 0, 1.0, [3, 4])
    assert set(everything) == {0, 1, 2, 3}
    np.testing.assert_array_equal(everything, draws(1.0, 0, 1.0, [3, 4]))
    assert (everything != draws(1.0, 0, 1.0, [3, 5])).any()


def test_the_draws_follow_the_probabilities():
    """8,192 rows: each token's share within 4 binomial standard errors of its probability; at
    temperature 2 the probabilities are those of the logits halved."""
    halved = np.sqrt(PROBS) / np.sqrt(PROBS).sum()
    for temperature, probs in ((1.0, np.array(PROBS)), (2.0, halved)):
        counts = np.bincount(draws(temperature, 0, 1.0, [7, 0], rows=8192), minlength=4)
        share = counts / counts.sum()
        error = np.sqrt(probs * (1 - probs) / counts.sum())
        assert (np.abs(share - probs) < 4 * error).all(), (temperature, share, probs)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0),
                                                     (1.3, 0, 0.8), (1.0, 7, 0.9)])
def test_the_draws_are_the_numpy_gumbel_max_of_the_hash_stream_eagerly_and_compiled(
        temperature, top_k, top_p):
    rng = np.random.default_rng(3)
    log_probs = rng.normal(size=(6, 50)) * 2
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    seed = [-12345, 17]
    # The kept set by hand: the top_k largest, then the smallest prefix reaching top_p.
    logits = log_probs / temperature
    order = np.argsort(-logits, axis=-1, kind="stable")
    kept = np.zeros_like(logits, bool)
    for row in range(len(logits)):
        ranked = order[row][:top_k or None]
        probs = np.exp(logits[row, ranked] - logits[row, ranked].max())
        probs /= probs.sum()
        before = np.cumsum(probs) - probs
        kept[row, ranked[(before < top_p) | (top_p >= 1.0) | (np.arange(len(ranked)) == 0)]] = True
    want = gumbel_max_draw(np.where(kept, logits, -np.inf), seed)
    args = (ops.convert_to_tensor(log_probs, "float32"), temperature, top_k, top_p,
            ops.convert_to_tensor(seed, "int32"))
    np.testing.assert_array_equal(to_numpy(sample_next(*args)), want)
    np.testing.assert_array_equal(to_numpy(compiled(sample_next)(*args)), want)
