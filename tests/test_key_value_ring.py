"""The key/value ring (segments written in place) against the key/value memory it replaces in
evaluation loops and against the numpy oracle, segment after segment, on every backend."""

import numpy as np
import pytest
from keras import ops

from backends import compiled, to_numpy
from factories import tiny_lm
from naive_reference import NaiveTransfoXL
from tfxl.layers import KeyValueMemory, KeyValueRing, RelativeMultiHeadAttention
from tfxl.layers.memory import RingSlots

pytestmark = pytest.mark.every_backend

CASES = {  # T, M (ring size S: the smallest multiple of T >= M + T) and settings
    "M<T": dict(tgt_len=4, mem_len=2),               # S 8: two slots never attended
    "M=T": dict(tgt_len=4, mem_len=4),               # S 8: no spare slot
    "M%T!=0 same_length clamp": dict(tgt_len=3, mem_len=7, same_length=True, clamp_len=3),
    "M=0": dict(tgt_len=3, mem_len=0),
    "pre_lnorm untie_r": dict(tgt_len=4, mem_len=5, pre_lnorm=True, untie_r=True),
}
LARGE_CASES = {"M<T", "M=T", "M%T!=0 same_length clamp"}
SEGMENTS = 5  # more than S / T for every case: every slot is rewritten at least once


def _data(lm, batch=2):
    rng = np.random.default_rng(0)
    t = lm.config.tgt_len
    ids = rng.integers(0, lm.config.vocab_size, (batch, SEGMENTS * t + 1))
    segment_valid = np.ones((SEGMENTS, batch, t), bool)
    segment_valid[2, 1, 0] = False  # left padding in one row of one segment
    reset = np.zeros((SEGMENTS, batch), bool)
    reset[3, 1] = True  # a new document in one row
    return ids, segment_valid, reset


def _run(lm, memory, step=None):
    """NLL of every segment [SEGMENTS, B, T] and the memory after the last."""
    t = lm.config.tgt_len
    ids, segment_valid, reset = _data(lm)
    position_keys = lm.position_keys(lm.config.mem_len + t, lm.config.clamp_len)
    step = step or (lambda x, y, m, v, r: lm(x, m, targets=y, segment_valid=v, reset=r,
                                             position_keys=position_keys))
    nlls = []
    for s in range(SEGMENTS):
        nll, memory = step(ids[:, s * t:(s + 1) * t], ids[:, s * t + 1:(s + 1) * t + 1],
                           memory, segment_valid[s], reset[s])
        nlls.append(to_numpy(nll))
    return np.stack(nlls), memory


def _assert_same_memory(got, want):
    """Keys and values equal at the valid slots (what a later segment can attend to)."""
    valid = to_numpy(want.valid)
    np.testing.assert_array_equal(to_numpy(got.valid), valid)
    for g, w in zip(got.keys, want.keys):
        np.testing.assert_allclose(to_numpy(g) * valid[:, None, None, :],
                                   to_numpy(w) * valid[:, None, None, :], atol=1e-5)
    for g, w in zip(got.values, want.values):
        np.testing.assert_allclose(to_numpy(g) * valid[:, None, :, None],
                                   to_numpy(w) * valid[:, None, :, None], atol=1e-5)


@pytest.mark.parametrize("case", [
    pytest.param(name, id=name, marks=[pytest.mark.large] if name in LARGE_CASES else [])
    for name in CASES])
def test_ring_equals_key_value_memory_segment_by_segment(case):
    lm = tiny_lm(**CASES[case])
    want, want_memory = _run(lm, lm.init_key_value_memory(2))
    ring = lm.init_key_value_ring(2)
    assert ring.size % lm.config.tgt_len == 0 and ring.size >= lm.config.mem_len + lm.config.tgt_len
    got, ring = _run(lm, ring)
    np.testing.assert_allclose(got, want, atol=1e-5)
    _assert_same_memory(ring.to_memory(), want_memory)


def test_ring_equals_the_oracle():
    lm = tiny_lm(tgt_len=3, mem_len=7)
    ids, _, _ = _data(lm)
    naive, ring = NaiveTransfoXL(lm.backbone), lm.init_key_value_ring(2)
    position_keys = lm.position_keys(10)
    for s in range(SEGMENTS):
        x = ids[:, 3 * s:3 * s + 3]
        hidden, ring = lm.backbone(x, ring, position_keys=position_keys)
        np.testing.assert_allclose(to_numpy(hidden), naive.step(x, 7), atol=2e-5,
                                   err_msg=f"segment {s}")


def test_compiled_ring_step_equals_eager_memory():
    """The step as evaluation compiles it (XLA on TensorFlow and JAX): the ring and its next
    slot are loop state, the slice_update a traced write."""
    lm = tiny_lm(tgt_len=4, mem_len=6)
    position_keys = lm.position_keys(10)
    want, want_memory = _run(lm, lm.init_key_value_memory(2))

    @compiled
    def step(x, y, memory, segment_valid, reset):
        return lm(x, memory, targets=y, segment_valid=segment_valid, reset=reset,
                  position_keys=position_keys)
    got, ring = _run(lm, lm.init_key_value_ring(2), lambda *a: step(*a))
    np.testing.assert_allclose(got, want, atol=1e-5)
    _assert_same_memory(ring.to_memory(), want_memory)


def test_a_memory_carried_into_a_ring_and_back():
    """from_memory / to_memory: a key/value memory of earlier segments (its invalid slots holding
    NaN, which the ring must not read) continues as a ring exactly."""
    lm = tiny_lm(tgt_len=4, mem_len=6)
    ids, _, _ = _data(lm)
    memory = lm.init_key_value_memory(2)
    _, memory = lm(ids[:, :4], memory)  # two of the six slots still empty
    poisoned = KeyValueMemory(memory.keys, tuple(
        ops.where(memory.valid[:, None, :, None], v, np.nan) for v in memory.values),
        memory.valid)
    ring = KeyValueRing.from_memory(poisoned, 4)
    for s in (1, 2, 3):
        x, y = ids[:, 4 * s:4 * s + 4], ids[:, 4 * s + 1:4 * s + 5]
        want, memory = lm(x, memory, targets=y)
        got, ring = lm(x, ring, targets=y)
        np.testing.assert_allclose(to_numpy(got), to_numpy(want), atol=1e-5)
    _assert_same_memory(ring.to_memory(), memory)


def test_a_segment_that_does_not_fit_the_ring_is_refused():
    lm = tiny_lm(tgt_len=4, mem_len=6)
    ring = lm.init_key_value_ring(2)  # S = 12: segments of 4, 3, 2 or 1 tokens
    lm(np.zeros((2, 3), "int32"), ring)
    with pytest.raises(ValueError, match="KeyValueRing of 12 slots and M = 6 .* got T = 5"):
        lm(np.zeros((2, 5), "int32"), ring)


@pytest.mark.parametrize("write_slot", [0, 3, 6, 9])
def test_ring_position_scores_are_each_slots_distance(write_slot):
    """The ring's BD (rel_shift over S slots, rolled to ring order) against the definition: query
    i and slot j score against the position key of their distance, counted from the ring's
    layout alone (slot j at offset o = (j - p) mod S: segment row o, or o - S positions back)."""
    t_len, m_len, heads, size = 3, 7, 2, 4
    ring_size = 12  # the smallest multiple of T >= M + T = 10
    layer = RelativeMultiHeadAttention(8, heads, size)
    layer.build((None, None, 8))
    rng = np.random.default_rng(0)
    query = rng.normal(size=(2, heads, t_len, size)).astype("float32")
    position_keys = rng.normal(size=(heads, size, m_len + t_len + 1)).astype("float32")
    ring = RingSlots(np.zeros((2, heads, size, ring_size), "float32"),
                     np.zeros((2, heads, ring_size, size), "float32"), write_slot)
    got = to_numpy(ring.position_score(layer, ops.convert_to_tensor(query),
                                       ops.convert_to_tensor(position_keys)))
    key_len = m_len + t_len
    for i in range(t_len):
        for j in range(ring_size):
            offset = (j - write_slot) % ring_size
            distance = i - offset if offset < t_len else i - offset + ring_size
            if 0 <= distance < key_len:  # the rest is masked
                want = np.einsum("bnh,nh->bn", query[:, :, i],
                                 position_keys[:, :, key_len - distance])
                np.testing.assert_allclose(got[:, :, i, j], want, atol=1e-5, err_msg=f"{i}, {j}")
