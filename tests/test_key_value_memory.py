"""The inference path (key/value memory, position keys computed once) against the training path
(layer-input memory) and the numpy oracle, segment after segment, on every backend."""

import numpy as np
import pytest

from backends import BACKEND, compiled, to_numpy
from factories import tiny_lm
from naive_reference import NaiveTransfoXL

pytestmark = pytest.mark.every_backend

T = 4


def lm_for(**kw):
    return tiny_lm(tgt_len=T, **kw)


CASES = {
    "mem<T": dict(mem_len=2),
    "mem=T": dict(mem_len=4),
    "mem>T same_length clamp": dict(mem_len=7, same_length=True, clamp_len=3),
    "pre_lnorm untie_r": dict(mem_len=7, pre_lnorm=True, untie_r=True),
    "adaptive div_val 2": dict(mem_len=5, cutoffs=(8, 15), div_val=2, d_embed=12),
}


@pytest.mark.parametrize("case", [
    pytest.param(name, id=name, marks=[pytest.mark.large] if name == "adaptive div_val 2" else [])
    for name in CASES])
def test_key_value_path_equals_layer_input_path_and_oracle(case):
    lm = lm_for(**CASES[case])
    c = lm.config
    rng = np.random.default_rng(0)
    ids = rng.integers(0, c.vocab_size, (2, 4 * T + 1))
    inputs, targets = ids[:, :-1], ids[:, 1:]
    naive = NaiveTransfoXL(lm.backbone) if c.div_val == 1 else None
    states, key_value = lm.init_memory(2), lm.init_key_value_memory(2, mem_len=c.mem_len)
    position_keys = lm.position_keys(c.mem_len + T)  # once, for every segment below
    for s in range(4):
        x, y = inputs[:, s * T:(s + 1) * T], targets[:, s * T:(s + 1) * T]
        if naive is not None:
            hidden, _ = lm.backbone(x, key_value, position_keys=position_keys)
            np.testing.assert_allclose(to_numpy(hidden), naive.step(x, c.mem_len), atol=2e-5,
                                       err_msg=f"oracle, segment {s}")
        want_nll, _ = lm(x, states, targets=y)
        want_log_probs, states = lm(x, states)
        got_nll, _ = lm(x, key_value, targets=y, position_keys=position_keys)
        got_log_probs, key_value = lm(x, key_value, position_keys=position_keys)
        np.testing.assert_allclose(to_numpy(got_nll), to_numpy(want_nll), atol=1e-5,
                                   err_msg=f"segment {s}")
        np.testing.assert_allclose(to_numpy(got_log_probs), to_numpy(want_log_probs), atol=1e-5,
                                   err_msg=f"segment {s}")
        # The key/value memory is at every step what the layer-input memory projects to.
        converted = lm.key_value_memory(states)
        for name in ("keys", "values"):
            np.testing.assert_allclose(to_numpy(key_value.to_dict()[name]),
                                       to_numpy(converted.to_dict()[name]), atol=1e-5)
        np.testing.assert_array_equal(to_numpy(key_value.valid), to_numpy(states.valid))
    assert key_value.to_dict()["keys"].shape == (2, c.n_layer, c.n_head, c.d_head, c.mem_len)
    assert key_value.to_dict()["values"].shape == (2, c.n_layer, c.n_head, c.mem_len, c.d_head)


@pytest.mark.large
def test_reset_rows_and_padding_follow_the_layer_input_path():
    lm = lm_for(mem_len=6, cutoffs=(8, 15), div_val=2)
    rng = np.random.default_rng(1)
    states, key_value = lm.init_memory(3), lm.init_key_value_memory(3, mem_len=6)
    position_keys = lm.position_keys(6 + T)
    for s in range(4):
        x = rng.integers(0, 23, (3, T))
        y = rng.integers(0, 23, (3, T))
        reset = np.array([s == 2, False, s % 2 == 1])
        valid = np.ones((3, T), bool)
        valid[1, :s] = False  # left padding of a growing width in row 1
        run = dict(reset=reset, segment_valid=valid, targets=y)
        want, states = lm(x, states, **run)
        got, key_value = lm(x, key_value, position_keys=position_keys, **run)
        np.testing.assert_allclose(to_numpy(got)[valid], to_numpy(want)[valid], atol=1e-5,
                                   err_msg=f"segment {s}")
        np.testing.assert_array_equal(to_numpy(key_value.valid), to_numpy(states.valid))


def test_a_trainers_memory_carries_over_to_the_inference_path():
    lm = lm_for(mem_len=6)
    rng = np.random.default_rng(2)
    segments = [rng.integers(0, 23, (2, T)) for _ in range(4)]
    states = lm.init_memory(2)
    for x in segments[:2]:
        _, states = lm(x, states)
    key_value = lm.key_value_memory(states)
    for x in segments[2:]:
        want, states = lm(x, states)
        got, key_value = lm(x, key_value)  # position keys computed by the call itself
        np.testing.assert_allclose(to_numpy(got), to_numpy(want), atol=1e-5)


@pytest.mark.skipif(BACKEND == "torch", reason="no compiled step on PyTorch (backends.compiled)")
def test_key_value_step_compiles_with_xla_and_agrees():
    lm = lm_for(mem_len=5, pre_lnorm=True)
    x = np.random.default_rng(3).integers(0, 23, (2, T))
    memory = lm.key_value_memory(lm(x, lm.init_memory(2, mem_len=5))[1])
    position_keys = lm.position_keys(5 + T)
    step = compiled(lambda ids, m, p: lm(ids, m, targets=ids, position_keys=p))
    got, got_memory = step(x, memory, position_keys)
    want, want_memory = lm(x, memory, targets=x, position_keys=position_keys)
    np.testing.assert_allclose(to_numpy(got), to_numpy(want), atol=1e-5)
    np.testing.assert_allclose(to_numpy(got_memory.to_dict()["keys"]),
                               to_numpy(want_memory.to_dict()["keys"]), atol=1e-5)


def test_position_keys_of_another_shape_are_refused():
    lm = lm_for(mem_len=5)
    with pytest.raises(ValueError, match="M \\+ T = 5 \\+ 4"):
        lm(np.zeros((1, T), np.int32), lm.init_key_value_memory(1, mem_len=5),
           position_keys=lm.position_keys(7))
