"""Relative attention against the naive per-pair oracle; rel_shift; masking; position encoding;
both layers' Keras contract (run_layer_test)."""

import numpy as np
import pytest
from keras import ops

from backends import to_numpy
from layer_test_case import run_layer_test
from naive_reference import attention_weights, relative_attention, sinusoid
from tfxl.layers import (RelativeMultiHeadAttention, RelativePositionEncoding, attention_mask,
                         rel_shift)

pytestmark = pytest.mark.every_backend


@pytest.mark.parametrize("t_len,m_len", [(4, 0), (4, 2), (4, 4), (3, 7)])
def test_rel_shift_reads_distance_columns(t_len, m_len):
    k_len = t_len + m_len
    x = np.random.randn(2, 3, t_len, k_len).astype(np.float32)
    out = to_numpy(rel_shift(ops.convert_to_tensor(x)))
    for i in range(t_len):
        for j in range(m_len + i + 1):  # entries above the causal diagonal are junk by design
            np.testing.assert_array_equal(out[..., i, j], x[..., i, j + t_len - 1 - i])


@pytest.mark.parametrize("clamp_len", [-1, 0, 3])
def test_position_encoding_rows_are_distances(clamp_len):
    d_model, k_len = 8, 6
    enc = to_numpy(RelativePositionEncoding(d_model, clamp_len)(key_length=k_len))
    assert enc.shape == (k_len, d_model)
    for m in range(k_len):
        distance = k_len - 1 - m
        if clamp_len >= 0:
            distance = min(distance, clamp_len)
        np.testing.assert_allclose(enc[m], sinusoid(distance, d_model), atol=1e-6)


def test_attention_mask_same_length_sees_mem_plus_one_keys():
    m_len, t_len = 3, 4
    valid = ops.ones((1, m_len), bool)
    mask = to_numpy(attention_mask(valid, t_len, same_length=True))[0, 0]
    np.testing.assert_array_equal(mask.sum(-1), [m_len + 1] * t_len)
    causal = to_numpy(attention_mask(valid, t_len, same_length=False))[0, 0]
    np.testing.assert_array_equal(causal.sum(-1), m_len + 1 + np.arange(t_len))


CASES = [
    # (m_len, same_length, clamp_len, pre_lnorm)
    (0, False, -1, False),
    (3, False, -1, False),   # memory shorter than the segment
    (5, False, -1, False),   # memory as long as the segment
    (9, False, -1, False),   # memory longer than the segment
    (9, True, -1, False),
    (3, True, 2, False),
    (5, False, 4, True),
]


@pytest.mark.parametrize("m_len,same_length,clamp_len,pre_lnorm", CASES)
def test_attention_matches_naive_per_pair(m_len, same_length, clamp_len, pre_lnorm):
    batch, t_len, d_model, n_head, d_head = 2, 5, 16, 2, 6
    layer = RelativeMultiHeadAttention(d_model, n_head, d_head, pre_lnorm=pre_lnorm,
                                       init_std=0.3)
    layer.build((batch, t_len, d_model))
    # Non-trivial LayerNorm parameters so a swapped gamma/beta cannot pass.
    layer.layer_norm.gamma.assign(np.random.uniform(0.5, 1.5, d_model))
    layer.layer_norm.beta.assign(np.random.randn(d_model) * 0.1)
    h = np.random.randn(batch, t_len, d_model).astype(np.float32)
    mem = np.random.randn(batch, m_len, d_model).astype(np.float32)
    mem_valid = np.random.rand(batch, m_len) > 0.3
    u = np.random.randn(n_head, d_head).astype(np.float32) * 0.3
    v = np.random.randn(n_head, d_head).astype(np.float32) * 0.3

    encoding = RelativePositionEncoding(d_model, clamp_len)(key_length=m_len + t_len)
    position_keys = layer.project_positions(encoding)
    mask = attention_mask(ops.convert_to_tensor(mem_valid), t_len, same_length)
    got, (segment_keys, segment_values) = layer(h, mem, position_keys, mask, u, v)
    # The key/value path: the memory rows arrive projected, only the T segment rows are.
    got_kv, (kv_keys, kv_values) = layer(h, layer.project_memory(mem), position_keys, mask, u, v)

    want = relative_attention(h.astype(np.float64), mem.astype(np.float64), mem_valid,
                              attention_weights(layer), u, v, clamp_len,
                              m_len if same_length else None, pre_lnorm)
    np.testing.assert_allclose(to_numpy(got), want, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(to_numpy(got_kv), want, atol=2e-5, rtol=1e-5)
    # The segment's own keys/values (what a key/value memory appends) are its projected rows.
    want_keys, want_values = layer.project_memory(h)
    for a, b in ((segment_keys, want_keys), (kv_keys, want_keys), (segment_values, want_values),
                 (kv_values, want_values)):
        np.testing.assert_allclose(to_numpy(a), to_numpy(b), atol=1e-6)


B, T, M, D, N, H = 2, 5, 3, 8, 2, 4


def attention_inputs(memory_kind):
    """The call arguments of RelativeMultiHeadAttention(D, N, H) (and of the block) for a
    memory of M rows of layer inputs or of projected keys and values."""
    rng = np.random.default_rng(0)
    projector = RelativeMultiHeadAttention(D, N, H, init_std=0.3)
    projector.build((B, T, D))
    memory = rng.normal(size=(B, M, D)).astype(np.float32)
    if memory_kind == "key_value":
        memory = tuple(to_numpy(x) for x in projector.project_memory(memory))
    position_keys = projector.project_positions(RelativePositionEncoding(D)(key_length=M + T))
    mask = attention_mask(ops.convert_to_tensor(rng.random((B, M)) > 0.3), T)
    return (rng.normal(size=(B, T, D)).astype(np.float32), memory, to_numpy(position_keys),
            to_numpy(mask), *rng.normal(size=(2, N, H)).astype(np.float32))


ATTENTION_OUTPUT_SHAPE = ((B, T, D), ((B, N, H, T), (B, N, T, H)))


def test_position_encoding_keras_contract():
    run_layer_test(RelativePositionEncoding, dict(d_model=D, clamp_len=3),
                   call_kwargs=dict(key_length=M + T), expected_output_shape=(M + T, D))


@pytest.mark.parametrize("memory_kind", ["layer_input", "key_value"])
@pytest.mark.parametrize("pre_lnorm", [False, True])
def test_attention_keras_contract(memory_kind, pre_lnorm):
    run_layer_test(RelativeMultiHeadAttention,
                   dict(d_model=D, n_head=N, d_head=H, dropout=0.1, dropatt=0.2,
                        pre_lnorm=pre_lnorm, init_std=0.3),
                   attention_inputs(memory_kind), expected_output_shape=ATTENTION_OUTPUT_SHAPE)


def test_one_key_attends_with_probability_one_and_no_warning():
    """M = 0, T = 1 (a one-token step without memory): the output is that of a softmax over the
    single key, without Keras' warning about a softmax over an axis of size 1."""
    import warnings
    layer = RelativeMultiHeadAttention(D, N, H, init_std=0.3)
    layer.build((B, 1, D))
    rng = np.random.default_rng(0)
    h = rng.normal(size=(B, 1, D)).astype(np.float32)
    u, v = rng.normal(size=(2, N, H)).astype(np.float32)
    position_keys = layer.project_positions(RelativePositionEncoding(D)(key_length=1))
    mask = attention_mask(ops.zeros((B, 0), "bool"), 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, _ = layer(h, np.zeros((B, 0, D), np.float32), position_keys, mask, u, v)
    assert not [w for w in caught if "softmax" in str(w.message)], [str(w.message) for w in caught]
    # One key: the context is that key's value; output = LayerNorm(h + value W_o).
    _, values = layer.project_memory(h)
    context = ops.reshape(ops.transpose(values, (0, 2, 1, 3)), (B, 1, N * H))
    want = layer.layer_norm(ops.convert_to_tensor(h) + ops.matmul(
        context, ops.reshape(layer.output_kernel, (N * H, D))))
    np.testing.assert_allclose(to_numpy(got), to_numpy(want), atol=1e-5)
