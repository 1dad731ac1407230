"""Faults a user of the Python API can cause: each one is refused clearly or has no effect."""

import numpy as np
import pytest
import tensorflow as tf

from factories import tiny_lm
from tfxl import AdaptiveEmbedding
from tfxl.layers.memory import as_memory

T, M = 3, 4


def small_lm(**kw):
    return tiny_lm(vocab_size=11, d_model=8, d_head=4, d_inner=16, tgt_len=T, mem_len=M,
                   init_std=0.3, **kw)


def with_garbage_in_invalid_slots(memory, garbage):
    """The memory with `garbage` written into every slot marked invalid."""
    invalid = ~memory.valid.numpy()  # [B, M]
    out = {"valid": memory.valid}
    for name, value in memory.to_dict().items():
        if name == "valid":
            continue
        value = value.numpy().copy()
        slot_axis = {"states": 2, "keys": 4, "values": 3}[name]
        # Move the slot axis next to the batch axis to index [B, M] at once.
        moved = np.moveaxis(value, slot_axis, 1)
        moved[invalid] = garbage
        out[name] = tf.constant(np.moveaxis(moved, 1, slot_axis))
    return as_memory(out)


@pytest.mark.parametrize("kind", ["states", "keys_values"])
@pytest.mark.parametrize("garbage", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("pre_lnorm", [False, True])
def test_invalid_memory_slots_have_no_influence(kind, garbage, pre_lnorm):
    lm = small_lm(pre_lnorm=pre_lnorm)
    rng = np.random.default_rng(0)
    first, second = rng.integers(0, 11, (2, 2, T))
    memory = lm.init_memory(2) if kind == "states" else lm.init_key_value_memory(2, mem_len=M)
    # Row 0 gets T valid slots (one is left invalid), row 1 none: a reset row.
    _, memory = lm(first, memory, reset=tf.constant([False, True]))
    memory = memory._replace(valid=tf.constant([[False] * (M - T) + [True] * T, [False] * M]))
    want_log_probs, want_memory = lm(second, memory)
    got_log_probs, got_memory = lm(second, with_garbage_in_invalid_slots(memory, garbage))
    assert np.isfinite(got_log_probs.numpy()).all()
    np.testing.assert_allclose(got_log_probs.numpy(), want_log_probs.numpy(), atol=1e-6)
    # The new memory's valid slots are the same (invalid ones may keep the garbage: harmless).
    np.testing.assert_array_equal(got_memory.valid, want_memory.valid)
    got, want = (with_garbage_in_invalid_slots(m, 0.0).to_dict()
                 for m in (got_memory, want_memory))
    for name in got:
        np.testing.assert_allclose(got[name], want[name], atol=1e-6, err_msg=name)


@pytest.mark.parametrize("div_val", [1, 2])
@pytest.mark.parametrize("bad_id", [-1, 11])
def test_embedding_refuses_out_of_range_ids_eagerly(div_val, bad_id):
    embedding = AdaptiveEmbedding(11, 8, 8, cutoffs=(4,) if div_val > 1 else (),
                                  div_val=div_val)
    embedding(tf.constant([[0, 10]]))  # the whole range [0, V) is accepted
    with pytest.raises(ValueError, match=rf"token id {bad_id} .*\[0, 11\)"):
        embedding(tf.constant([[1, bad_id, 2]]))


def test_language_model_refuses_negative_ids_eagerly():
    with pytest.raises(ValueError, match=r"token id -1 "):
        small_lm()(tf.constant([[1, -1, 2]]))


@pytest.mark.parametrize("bad, message", [
    (dict(top_p=1.5), r"top_p must be in \(0, 1\].*got 1.5"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\].*got 0.0"),
    (dict(temperature=-1.0), r"temperature must be >= 0.*got -1.0"),
    (dict(top_k=-1), r"top_k must be >= 0.*got -1"),
    (dict(max_new_tokens=0), r"max_new_tokens must be >= 1, got 0"),
    (dict(prompt_ids=[[1, -1]]), r"prompt_ids: token id -1 is outside the vocabulary \[0, 11\)"),
    (dict(prompt_ids=[[11]]), r"prompt_ids: token id 11 is outside"),
])
def test_generate_refuses_what_the_command_line_and_the_signatures_refuse(bad, message):
    """The same rule (`tfxl.models.sampling.sampling_rules`) as tfxl-generate and the export;
    refused before anything is traced."""
    lm = small_lm()
    args = {**dict(prompt_ids=[[1, 2]], max_new_tokens=2, temperature=1.0, top_k=0, top_p=1.0),
            **bad}
    with pytest.raises(ValueError, match=message):
        lm.generate(**args)
    assert not getattr(lm, "_generate_loops", None)


@pytest.mark.large
def test_generate_accepts_the_edges_of_each_range():
    lm = small_lm()
    assert lm.generate([[0, 10]], 1, temperature=0.0, top_k=0, top_p=1.0).shape == (1, 1)


def test_memory_from_time_major_takes_n_layer_arrays_or_drops_pytorchs_last():
    """PyTorch's MemTransformerLM keeps L + 1 mems (the last: the last layer's output, no
    layer's input), TF1 and Hugging Face L: the L + 1-th was kept as a layer before."""
    from tfxl.convert import ConversionError, memory_from_time_major
    n_layer, m, batch, d = 2, 3, 1, 4
    mems = [np.full((m, batch, d), layer, np.float32) for layer in range(n_layer + 2)]
    for given in (n_layer, n_layer + 1):
        memory = memory_from_time_major(mems[:given], n_layer)
        assert memory.states.shape == (batch, n_layer, m, d)
        np.testing.assert_array_equal(memory.states[0, :, 0, 0], range(n_layer))
    for given in (n_layer - 1, n_layer + 2):
        with pytest.raises(ConversionError, match=f"mems has {given} arrays; a model of "
                           f"n_layer={n_layer} takes {n_layer} .* or {n_layer + 1}"):
            memory_from_time_major(mems[:given], n_layer)
