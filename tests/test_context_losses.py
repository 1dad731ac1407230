"""Loss by context length (tfxl.analysis.context): segments on memory against one full pass and
the numpy oracle, a capped context, the positions, the batching and the bounds."""

import numpy as np
import pytest

from backends import to_numpy
from factories import tiny_lm
from naive_reference import NaiveTransfoXL
from tfxl.analysis import context_losses, target_positions
from tfxl.models.scoring import score_document

pytestmark = pytest.mark.every_backend

TOKENS = np.random.default_rng(3).integers(0, 23, size=200)


@pytest.fixture(scope="module")
def lm():
    return tiny_lm(tgt_len=4, mem_len=16)


def test_a_context_read_in_segments_on_memory_equals_one_full_pass_and_the_oracle(lm):
    positions = target_positions(TOKENS.size, 5, 11, seed=1)
    contexts = [3, 7, 11]  # within mem_len + tgt_len: the memory holds every token read
    losses = context_losses(lm, TOKENS, positions, contexts, batch_size=5)
    for k, c in enumerate(contexts):
        windows = TOKENS[positions[:, None] + np.arange(-c, 1)].astype(np.int32)
        one_pass, _ = score_document(lm, windows, tgt_len=c, mem_len=0)  # one segment of c
        np.testing.assert_allclose(losses[k], to_numpy(one_pass)[:, -1], rtol=1e-5, atol=1e-5)
        hidden = NaiveTransfoXL(lm.backbone).step(windows[:, :-1], mem_len=0)
        oracle = to_numpy(lm.head(hidden.astype(np.float32), windows[:, 1:]))[:, -1]
        np.testing.assert_allclose(losses[k], oracle, rtol=1e-5, atol=1e-5)
    assert np.all(np.diff(losses, axis=0) != 0)  # each context is read: the losses differ


def test_a_model_that_sees_one_segment_has_the_same_loss_at_every_longer_context(lm):
    # Without memory the target sees only its own segment: the 4 tokens before it at every
    # context that is a multiple of the segment length.
    positions = target_positions(TOKENS.size, 6, 16, seed=2)
    losses = context_losses(lm, TOKENS, positions, [4, 8, 12, 16], batch_size=6, mem_len=0)
    for k in range(1, 4):
        np.testing.assert_allclose(losses[k], losses[0], rtol=1e-5, atol=1e-6)
    with_memory = context_losses(lm, TOKENS, positions, [4, 8], batch_size=6)
    assert np.abs(with_memory[1] - with_memory[0]).max() > 1e-4


def test_batches_of_any_size_give_the_same_losses_and_report_progress(lm):
    positions = target_positions(TOKENS.size, 5, 6, seed=4)
    whole = context_losses(lm, TOKENS, positions, [2, 6], batch_size=5)
    seen = []
    padded = context_losses(lm, TOKENS, positions, [2, 6], batch_size=2,
                            progress=lambda done, total: seen.append((done, total)))
    np.testing.assert_allclose(padded, whole, rtol=1e-5, atol=1e-6)
    assert seen[-1] == (5 * (3 + 7), 5 * (3 + 7)) and len(seen) == 6


def test_target_positions_are_seeded_distinct_sorted_and_leave_room_for_the_context():
    a = target_positions(100, 20, 30, seed=7)
    assert np.array_equal(a, target_positions(100, 20, 30, seed=7))
    assert not np.array_equal(a, target_positions(100, 20, 30, seed=8))
    assert len(set(a.tolist())) == 20 and np.all(np.diff(a) > 0)
    assert a.min() >= 30 and a.max() < 100
    assert target_positions(100, 70, 30).tolist() == list(range(30, 100))
    with pytest.raises(ValueError, match="positions: 71 asked, but the split has 70 targets"):
        target_positions(100, 71, 30)


@pytest.mark.parametrize("change, message", [
    (dict(contexts=[4, 2]), "contexts: increasing"),
    (dict(contexts=[0, 2]), "contexts: increasing ints >= 1"),
    (dict(positions=np.array([3])), r"positions: each in \[4, 200\)"),
    (dict(positions=np.array([200])), r"positions: each in \[4, 200\)"),
    (dict(batch_size=0), "batch_size: 1.."),
    (dict(batch_size=10**9), "batch_size: 1.."),
    (dict(tokens=TOKENS.astype(float)), "tokens: a 1-D integer array"),
])
def test_a_bad_argument_is_refused_before_anything_is_read(lm, change, message):
    arguments = dict(tokens=TOKENS, positions=np.array([10, 20]), contexts=[2, 4], batch_size=2)
    with pytest.raises(ValueError, match=message):
        context_losses(lm, **{**arguments, **change})
