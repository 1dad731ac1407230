"""Configs, presets, `.keras` files and tf.train checkpoints of the model (each layer's own
config and `.keras` round trips: run_layer_test in that layer's tests); on every backend but
the tf.train checkpoint."""

import json

import keras
import numpy as np
import pytest

import tfxl
from backends import to_numpy
from factories import adaptive_config
from tfxl import PRESETS, TransfoXLConfig, TransfoXLLM, get_preset

pytestmark = pytest.mark.every_backend


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
        adaptive_config(**bad)


def test_config_rejects_unknown_fields():
    with pytest.raises(ValueError, match="unknown field"):
        TransfoXLConfig.from_dict({"n_layers": 3})


@pytest.mark.large
def test_keras_file_round_trip_gives_identical_outputs(tmp_path):
    lm = TransfoXLLM(adaptive_config())
    ids = np.random.randint(0, 40, (2, 6))
    want, memory = lm(ids, targets=ids)
    want_lp, _ = lm(ids, memory)
    path = str(tmp_path / "lm.keras")
    lm.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, TransfoXLLM) and loaded.config == lm.config
    got, memory2 = loaded(ids, targets=ids)
    np.testing.assert_allclose(to_numpy(got), to_numpy(want), atol=1e-6)
    np.testing.assert_allclose(to_numpy(loaded(ids, memory2)[0]), to_numpy(want_lp), atol=1e-6)
    clone = TransfoXLLM.from_config(lm.get_config())
    clone(ids)
    clone.set_weights(lm.get_weights())
    np.testing.assert_allclose(to_numpy(clone(ids, targets=ids)[0]), to_numpy(want), atol=1e-6)


def test_import_registers_package_objects():
    assert keras.saving.get_registered_name(tfxl.TransfoXLLM) == "tfxl>TransfoXLLM"


@pytest.mark.tensorflow_only
def test_tf_checkpoint_tracks_every_weight(tmp_path):
    """The trainer checkpoints with tf.train.Checkpoint: every variable must be reachable."""
    import tensorflow as tf
    lm = TransfoXLLM(adaptive_config(tie_weight=False))
    ids = np.random.randint(0, 40, (2, 6))
    want, _ = lm(ids, targets=ids)
    path = tf.train.Checkpoint(model=lm).write(str(tmp_path / "ckpt"))
    stored = tf.train.list_variables(path)
    n_stored = sum(1 for name, _ in stored if name.startswith("model/"))
    assert n_stored == len(lm.weights)
    clone = TransfoXLLM(adaptive_config(tie_weight=False))
    clone(ids)
    tf.train.Checkpoint(model=clone).read(path).assert_consumed()
    np.testing.assert_allclose(to_numpy(clone(ids, targets=ids)[0]), to_numpy(want), atol=1e-6)


def test_config_file_errors_name_the_file(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(adaptive_config().to_json())
    assert TransfoXLConfig.from_file(str(good)) == adaptive_config()
    cases = {"missing.json": None, "broken.json": "{not json", "list.json": "[1, 2]",
             "typed.json": '{"n_layer": "two"}'}
    for name, text in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        with pytest.raises(ValueError, match=name):
            TransfoXLConfig.from_file(str(path))
