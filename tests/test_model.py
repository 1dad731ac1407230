"""The backbone and language model: naive oracle, recurrence identity, memory semantics,
gradients, XLA and mixed precision, on every backend."""

import keras
import numpy as np
import pytest

from backends import BACKEND, compiled, to_numpy, value_and_gradients
from factories import adaptive_config, tiny_config
from layer_test_case import run_layer_test
from naive_reference import NaiveTransfoXL
from tfxl import TransfoXLBackbone, TransfoXLLM

pytestmark = pytest.mark.every_backend


def built_backbone(config, batch=2):
    backbone = TransfoXLBackbone(config)
    backbone(np.zeros((batch, config.tgt_len), np.int32))
    return backbone


@pytest.mark.parametrize("mem_len,same_length,clamp_len,untie_r,pre_lnorm,d_embed", [
    pytest.param(0, False, -1, False, False, None, marks=pytest.mark.large),
    pytest.param(2, False, -1, True, False, None,  # memory shorter than the segment
                 marks=pytest.mark.large),
    (4, True, -1, False, False, 12),       # = segment, projected embedding
    (7, True, 3, True, False, None),       # longer than the segment, clamped distances
    (7, False, -1, False, True, None),     # pre-LN
])
def test_backbone_matches_naive_segment_by_segment(mem_len, same_length, clamp_len, untie_r,
                                                   pre_lnorm, d_embed):
    config = tiny_config(mem_len=mem_len, same_length=same_length, clamp_len=clamp_len,
                          untie_r=untie_r, pre_lnorm=pre_lnorm, d_embed=d_embed)
    backbone = built_backbone(config)
    naive = NaiveTransfoXL(backbone)
    ids = np.random.randint(0, config.vocab_size, (2, 4 * config.tgt_len))
    memory = None
    for s in range(4):
        segment = ids[:, s * config.tgt_len:(s + 1) * config.tgt_len]
        hidden, memory = backbone(segment, memory)
        np.testing.assert_allclose(to_numpy(hidden), naive.step(segment, mem_len), atol=2e-5,
                                   err_msg=f"segment {s}")


@pytest.mark.large
@pytest.mark.parametrize("tgt_len", [1, 3, 6])
def test_segments_with_long_memory_equal_one_full_pass(tgt_len):
    total = 12
    config = tiny_config(tgt_len=tgt_len, mem_len=total, cutoffs=(8, 15), div_val=2)
    lm = TransfoXLLM(config)
    ids = np.random.randint(0, config.vocab_size, (3, total + 1))
    inputs, targets = ids[:, :-1], ids[:, 1:]
    full_nll, _ = lm(inputs, lm.init_memory(3, mem_len=0), targets=targets)
    memory, pieces = None, []
    for start in range(0, total, tgt_len):
        nll, memory = lm(inputs[:, start:start + tgt_len], memory,
                         targets=targets[:, start:start + tgt_len])
        pieces.append(to_numpy(nll))
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), to_numpy(full_nll), atol=1e-5)


def test_fresh_memory_is_never_attended():
    """An empty memory of 6 slots gives exactly what no memory gives: zero slots are masked."""
    config = tiny_config(mem_len=6)
    backbone = built_backbone(config)
    ids = np.random.randint(0, config.vocab_size, (2, 4))
    with_empty, _ = backbone(ids, backbone.init_memory(2, 6))
    without, _ = backbone(ids, backbone.init_memory(2, 0))
    np.testing.assert_allclose(to_numpy(with_empty), to_numpy(without), atol=1e-6)


def test_reset_clears_only_the_flagged_rows():
    config = tiny_config(mem_len=4)
    backbone = built_backbone(config)
    first, second = (np.random.randint(0, config.vocab_size, (2, 4)) for _ in range(2))
    _, memory = backbone(first)
    out, _ = backbone(second, memory, reset=np.array([True, False]))
    fresh, _ = backbone(second)
    carried, _ = backbone(second, memory)
    np.testing.assert_allclose(to_numpy(out)[0], to_numpy(fresh)[0], atol=1e-6)
    np.testing.assert_allclose(to_numpy(out)[1], to_numpy(carried)[1], atol=1e-6)
    assert np.abs(to_numpy(carried)[0] - to_numpy(fresh)[0]).max() > 1e-3  # memory did matter


def test_memory_update_keeps_last_positions_and_static_shapes():
    config = tiny_config(mem_len=6, tgt_len=4)
    backbone = built_backbone(config)
    _, m1 = backbone(np.zeros((2, 4), np.int32))
    np.testing.assert_array_equal(to_numpy(m1.valid)[0], [False, False, True, True, True, True])
    assert m1.states.shape == (2, 2, 6, 16)
    _, m2 = backbone(np.ones((2, 4), np.int32), m1)
    assert to_numpy(m2.valid).all()
    # Slots 0-1 of the new memory are the last two positions of the first segment.
    np.testing.assert_allclose(to_numpy(m2.states)[:, :, :2], to_numpy(m1.states)[:, :, -2:])


@pytest.mark.large
def test_no_gradient_flows_into_memory():
    config = tiny_config(mem_len=4)
    lm = TransfoXLLM(config)
    a, b = (np.random.randint(0, config.vocab_size, (2, 5)) for _ in range(2))
    # The same loss with the memory as a constant (numpy) has the same gradients.
    frozen = keras.tree.map_structure(to_numpy, lm(a[:, :4], targets=a[:, 1:])[1])

    def loss_through_memory():
        _, memory = lm(a[:, :4], targets=a[:, 1:])
        return keras.ops.mean(lm(b[:, :4], memory, targets=b[:, 1:])[0])

    def loss_on_constant_memory():
        return keras.ops.mean(lm(b[:, :4], frozen, targets=b[:, 1:])[0])

    variables = lm.trainable_variables
    _, grads = value_and_gradients(loss_through_memory, variables)
    _, grads2 = value_and_gradients(loss_on_constant_memory, variables)
    for g, g2, v in zip(grads, grads2, variables):
        np.testing.assert_allclose(g, g2, atol=1e-7, err_msg=v.path)
    by_name = {v.path: g for v, g in zip(variables, grads)}
    for name in ("content_bias", "position_bias", "position_kernel"):
        hits = [g for p, g in by_name.items() if p.endswith(name)]
        assert hits and all(np.abs(g).max() > 0 for g in hits), name


def test_call_time_eval_settings_equal_a_model_configured_with_them():
    config = tiny_config(mem_len=5)
    evaluated = tiny_config(mem_len=5, clamp_len=2, same_length=True)
    a, b = TransfoXLBackbone(config), TransfoXLBackbone(evaluated)
    ids = np.random.randint(0, config.vocab_size, (2, 4))
    _, memory = a(ids)
    b(ids)
    b.set_weights(a.get_weights())
    got, _ = a(ids, memory, clamp_len=2, same_length=True)
    want, _ = b(ids, memory)
    plain, _ = a(ids, memory)
    np.testing.assert_allclose(to_numpy(got), to_numpy(want), atol=1e-6)
    assert np.abs(to_numpy(got) - to_numpy(plain)).max() > 1e-4


@pytest.mark.large
def test_left_padding_is_invisible_to_real_tokens_and_memory():
    config = tiny_config(mem_len=6)
    backbone = built_backbone(config)
    real = np.random.randint(0, config.vocab_size, (1, 3))
    padded = np.concatenate([np.full((1, 2), 7), real], axis=1)  # two pad tokens in front
    valid = np.array([[False, False, True, True, True]])
    got, memory = backbone(padded, segment_valid=valid)
    want, want_memory = backbone(real)
    np.testing.assert_allclose(to_numpy(got)[:, 2:], to_numpy(want), atol=1e-6)
    np.testing.assert_array_equal(to_numpy(memory.valid), [[False] * 3 + [True] * 3])
    nxt = np.random.randint(0, config.vocab_size, (1, 2))
    np.testing.assert_allclose(to_numpy(backbone(nxt, memory)[0]),
                               to_numpy(backbone(nxt, want_memory)[0]), atol=1e-6)


@pytest.mark.large
@pytest.mark.skipif(BACKEND == "torch", reason="no compiled step on PyTorch (backends.compiled)")
def test_xla_step_equals_eager():
    config = adaptive_config(same_length=True, clamp_len=4)
    lm = TransfoXLLM(config)
    ids = np.random.randint(0, config.vocab_size, (2, 6)).astype(np.int32)
    memory = lm.init_memory(2)

    def two_steps(ids, memory):
        nll1, memory = lm(ids, memory, targets=ids)
        nll2, memory = lm(ids[:, ::-1], memory, targets=ids)
        return nll1, nll2, memory

    eager = two_steps(ids, memory)
    xla = compiled(two_steps)(ids, memory)
    for a, b in zip(keras.tree.flatten(eager), keras.tree.flatten(xla)):
        np.testing.assert_allclose(to_numpy(a).astype(np.float32),
                                   to_numpy(b).astype(np.float32), atol=1e-5)


@pytest.mark.large
def test_mixed_bfloat16_runs_finite_and_close_to_float32():
    config = adaptive_config()
    ids = np.random.randint(0, config.vocab_size, (2, 6))
    lm32 = TransfoXLLM(config)
    nll32, mem32 = lm32(ids, targets=ids)
    keras.config.set_dtype_policy("mixed_bfloat16")
    lm16 = TransfoXLLM(config)
    lm16(ids)
    lm16.set_weights(lm32.get_weights())
    nll16, mem16 = lm16(ids, targets=ids)
    dtype = keras.backend.standardize_dtype
    assert dtype(nll16.dtype) == "float32" and dtype(mem16.states.dtype) == "bfloat16"
    assert np.isfinite(to_numpy(nll16)).all()
    np.testing.assert_allclose(to_numpy(nll16), to_numpy(nll32), atol=3e-2, rtol=1e-2)
    nll16b, _ = lm16(ids, mem16, targets=ids)
    assert np.isfinite(to_numpy(nll16b)).all()


@pytest.mark.large
@pytest.mark.parametrize("memory_kind", ["layer_input", "key_value"])
def test_backbone_keras_contract(memory_kind):
    config = tiny_config(mem_len=3, cutoffs=(8, 15), div_val=2, d_embed=12)
    ids = np.random.randint(0, config.vocab_size, (2, config.tgt_len))
    probe = TransfoXLBackbone(config)
    _, memory = probe(ids)
    if memory_kind == "key_value":
        memory = probe.key_value_memory(memory)
    run_layer_test(TransfoXLBackbone, dict(config=config),
                   (ids, keras.tree.map_structure(to_numpy, memory)))
