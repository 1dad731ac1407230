"""Configs, get_config/from_config, .keras files, XLA and mixed precision."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfxl
from tfxl import PRESETS, TransfoXLConfig, TransfoXLLM, get_preset
from tfxl.layers import (AdaptiveEmbedding, AdaptiveSoftmax, PositionwiseFeedForward,
                         RelativeMultiHeadAttention, RelativePositionEncoding, TransformerXLBlock)


def lm_config(**kw):
    base = dict(vocab_size=40, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32,
                d_embed=16, cutoffs=(10, 25), div_val=2, untie_r=True, dropout=0.0, tgt_len=6,
                mem_len=5, init_std=0.1)
    return TransfoXLConfig(**{**base, **kw})


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_round_trip_through_json(name):
    config = get_preset(name)
    again = TransfoXLConfig.from_json(config.to_json())
    assert again == config
    assert json.loads(config.to_json())["n_layer"] == PRESETS[name]["n_layer"]


def test_paper_presets_carry_eval_settings():
    assert get_preset("enwik8_base").eval_settings() == dict(
        tgt_len=80, mem_len=2100, clamp_len=820, same_length=True)
    assert get_preset("wt103_base").eval_settings() == dict(
        tgt_len=64, mem_len=640, clamp_len=400, same_length=True)


@pytest.mark.parametrize("bad,msg", [
    (dict(cutoffs=(30, 10)), "cutoffs"), (dict(mem_len=-1), "mem_len"),
    (dict(d_model=15), "even"), (dict(tie_projs=(True,)), "tie_projs")])
def test_config_rejects_bad_values(bad, msg):
    with pytest.raises(ValueError, match=msg):
        lm_config(**bad)
    with pytest.raises(ValueError, match="unknown field"):
        TransfoXLConfig.from_dict({"n_layers": 3})


@pytest.mark.parametrize("layer", [
    RelativePositionEncoding(8, clamp_len=3),
    RelativeMultiHeadAttention(8, 2, 4, dropout=0.1, dropatt=0.2, pre_lnorm=True),
    PositionwiseFeedForward(8, 16, dropout=0.1),
    TransformerXLBlock(8, 2, 4, 16, 0.1, 0.0, True),
    AdaptiveEmbedding(40, 16, 8, (10, 25), 2),
    AdaptiveSoftmax(40, 16, 8, (10, 25), 2, tie_projs=(False, True, True)),
])
def test_every_layer_round_trips_its_config(layer):
    clone = layer.__class__.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    registered = keras.saving.get_registered_object(f"tfxl>{layer.__class__.__name__}")
    assert registered is layer.__class__


def test_keras_file_round_trip_gives_identical_outputs(tmp_path):
    lm = TransfoXLLM(lm_config())
    ids = np.random.randint(0, 40, (2, 6))
    want, memory = lm(ids, targets=ids)
    want_lp, _ = lm(ids, memory)
    path = str(tmp_path / "lm.keras")
    lm.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, TransfoXLLM) and loaded.config == lm.config
    got, memory2 = loaded(ids, targets=ids)
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-6)
    np.testing.assert_allclose(loaded(ids, memory2)[0].numpy(), want_lp.numpy(), atol=1e-6)
    clone = TransfoXLLM.from_config(lm.get_config())
    clone(ids)
    clone.set_weights(lm.get_weights())
    np.testing.assert_allclose(clone(ids, targets=ids)[0].numpy(), want.numpy(), atol=1e-6)


def test_xla_step_equals_eager():
    lm = TransfoXLLM(lm_config(same_length=True, clamp_len=4))
    ids = np.random.randint(0, 40, (2, 6)).astype(np.int32)
    memory = lm.init_memory(2)

    def two_steps(ids, memory):
        nll1, memory = lm(ids, memory, targets=ids)
        nll2, memory = lm(ids[:, ::-1], memory, targets=ids)
        return nll1, nll2, memory

    eager = two_steps(ids, memory)
    compiled = tf.function(two_steps, jit_compile=True)(tf.constant(ids), memory)
    for a, b in zip(tf.nest.flatten(eager), tf.nest.flatten(compiled)):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   atol=1e-5)


def test_mixed_bfloat16_runs_finite_and_close_to_float32():
    config = lm_config()
    ids = np.random.randint(0, 40, (2, 6))
    lm32 = TransfoXLLM(config)
    nll32, mem32 = lm32(ids, targets=ids)
    keras.config.set_dtype_policy("mixed_bfloat16")
    lm16 = TransfoXLLM(config)
    lm16(ids)
    lm16.set_weights(lm32.get_weights())
    nll16, mem16 = lm16(ids, targets=ids)
    assert nll16.dtype == tf.float32 and mem16["states"].dtype == tf.bfloat16
    assert np.isfinite(nll16.numpy()).all()
    np.testing.assert_allclose(nll16.numpy(), nll32.numpy(), atol=3e-2, rtol=1e-2)
    nll16b, _ = lm16(ids, mem16, targets=ids)
    assert np.isfinite(nll16b.numpy()).all()


def test_import_registers_package_objects():
    assert keras.saving.get_registered_name(tfxl.TransfoXLLM) == "tfxl>TransfoXLLM"


def test_tf_checkpoint_tracks_every_weight(tmp_path):
    """The trainer checkpoints with tf.train.Checkpoint: every variable must be reachable."""
    lm = TransfoXLLM(lm_config(tie_weight=False))
    ids = np.random.randint(0, 40, (2, 6))
    want, _ = lm(ids, targets=ids)
    path = tf.train.Checkpoint(model=lm).write(str(tmp_path / "ckpt"))
    stored = tf.train.list_variables(path)
    n_stored = sum(1 for name, _ in stored if name.startswith("model/"))
    assert n_stored == len(lm.weights)
    clone = TransfoXLLM(lm_config(tie_weight=False))
    clone(ids)
    tf.train.Checkpoint(model=clone).read(path).assert_consumed()
    np.testing.assert_allclose(clone(ids, targets=ids)[0].numpy(), want.numpy(), atol=1e-6)


def test_config_file_errors_name_the_file(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(lm_config().to_json())
    assert TransfoXLConfig.from_file(str(good)) == lm_config()
    cases = {"missing.json": None, "broken.json": "{not json", "list.json": "[1, 2]",
             "typed.json": '{"n_layer": "two"}'}
    for name, text in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        with pytest.raises(ValueError, match=name):
            TransfoXLConfig.from_file(str(path))
