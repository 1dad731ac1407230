"""`tfxl-train --init_checkpoint`: a new run starts from another model's weights (a .keras file,
another model_dir, a checkpoint prefix) with a fresh optimizer, memory and step; what does not
fit is listed in one error line and nothing is written."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import factories
from backends import JAX_XLA_FLAGS
from tfxl.checkpoints import warm_start
from tfxl.checkpoints.tree import restore_weights, variables_by_path
from tfxl.model_dir import check_or_store_config
from tfxl.train.tasks.language_model import build_model
from tfxl.train.loop.optimization import OptimizerParams
from tfxl.train.records.train_log import read_train_log

T = 8          # segment length of the test data
STREAMS = 4    # streams per split


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return factories.random_bytes_data(tmp_path_factory.mktemp("warm"), T, STREAMS)


def manifest(data_dir):
    with open(os.path.join(data_dir, "manifest.json")) as f:
        return json.load(f)


def runner(data_dir, model_dir, steps, **changes):
    c = factories.data_config(data_dir, tgt_len=T, **changes)
    check_or_store_config(str(model_dir), c, store=False)  # what tfxl-train does first
    return factories.language_model_run(
        c, data_dir=data_dir, model_dir=str(model_dir), global_batch=STREAMS,
        optimizer=OptimizerParams(learning_rate=3e-3, train_steps=steps, min_lr_ratio=1.0),
        steps_per_loop=5, lease=factories.fast_lease())


@pytest.fixture(scope="module")
def source(data_dir, tmp_path_factory):
    """A model_dir trained for 10 steps (checkpoints at 5 and 10)."""
    model_dir = tmp_path_factory.mktemp("source") / "m"
    runner(data_dir, model_dir, 10).train(save_every=5, log=lambda *a: None)
    return str(model_dir)


def weights(model):
    return {path: v.numpy() for path, v in variables_by_path(model).items()}


def source_model(data_dir, source, checkpoint=None):
    model = build_model(factories.data_config(data_dir), tf.distribute.get_strategy())
    restore_weights(model, checkpoint, os.path.join(source, "checkpoints"))
    return model


def first_batch_loss(model, run):
    """The loss of `model` (no dropout, empty memory) on the first training batch of `run`."""
    features = next(iter(run.data.dataset("train", STREAMS, True, skip_batches=0)))
    nll, _ = model(features["inputs"], model.init_memory(STREAMS), reset=features["reset"],
                   targets=features["targets"], training=False)
    mask = tf.cast(features["target_mask"], nll.dtype)
    return float(tf.reduce_sum(nll * mask) / tf.reduce_sum(mask))


def logged_losses(model_dir):
    return [r["loss"] for r in read_train_log(str(model_dir))]


def assert_warm_started(data_dir, model_dir, init, expected_model, expected_path):
    """A run on `model_dir` warm-started from `init` begins at step 0 with `expected_model`'s
    weights exactly, and its first loss is that model's loss on the first batch."""
    run = runner(data_dir, model_dir, 1, dropout=0.0)  # no dropout: the loss is the model's
    messages = []
    used = warm_start.warm_start(init, run.model, str(model_dir), manifest(data_dir), data_dir,
                                 log=messages.append)
    run.init_checkpoint = used
    assert used == expected_path
    assert any("warm start: model weights from" in m for m in messages), messages
    expected = weights(expected_model)
    got = weights(run.model)
    assert sorted(got) == sorted(expected) and len(got) == len(run.model.trainable_variables)
    for path in expected:
        np.testing.assert_array_equal(got[path], expected[path], err_msg=path)
    assert run.train_step.step == 0 and int(run.train_step.optimizer.iterations.numpy()) == 0
    assert all(not np.any(v.numpy()) for v in run.train_step.optimizer.variables[1:])  # fresh slots
    assert not np.any(run.train_step.memory.read().valid.numpy())
    want = first_batch_loss(expected_model, run)
    metrics = run.train(save_every=0, log=lambda *a: None)
    assert logged_losses(model_dir)[0] == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert metrics["start_step"] == 0 and metrics["init_checkpoint"] == expected_path


def test_warm_start_from_another_model_dir(data_dir, source, tmp_path):
    expected = source_model(data_dir, source)
    assert_warm_started(data_dir, tmp_path / "m", source, expected,
                        os.path.join(source, "checkpoints", "ckpt-10"))


def test_warm_start_from_a_checkpoint_prefix(data_dir, source, tmp_path):
    prefix = os.path.join(source, "checkpoints", "ckpt-5")
    expected = source_model(data_dir, source, prefix)
    assert not np.array_equal(weights(expected)["softmax/bias"],
                              weights(source_model(data_dir, source))["softmax/bias"])
    assert_warm_started(data_dir, tmp_path / "m", prefix, expected, prefix)


def test_warm_start_from_a_keras_file(data_dir, source, tmp_path):
    expected = source_model(data_dir, source)
    path = str(tmp_path / "source.keras")
    expected.save(path)
    assert_warm_started(data_dir, tmp_path / "m", path, expected, path)


def test_a_damaged_newest_checkpoint_of_the_source_is_skipped(data_dir, source, tmp_path):
    copy = tmp_path / "source"
    tf.io.gfile.makedirs(str(copy / "checkpoints"))
    for name in tf.io.gfile.listdir(os.path.join(source, "checkpoints")):
        tf.io.gfile.copy(os.path.join(source, "checkpoints", name),
                         str(copy / "checkpoints" / name))
    data = copy / "checkpoints" / "ckpt-10.data-00000-of-00001"
    os.truncate(data, os.path.getsize(data) // 2)
    messages = []
    resolved = warm_start.resolve(str(copy), log=messages.append)
    assert resolved.path == str(copy / "checkpoints" / "ckpt-5")
    assert any("skipping damaged checkpoint" in m and "ckpt-10" in m for m in messages)


@pytest.mark.large
def test_a_run_with_checkpoints_resumes_and_ignores_the_flag(data_dir, source, tmp_path):
    model_dir = tmp_path / "m"
    runner(data_dir, model_dir, 5).train(save_every=5, log=lambda *a: None)
    run = runner(data_dir, model_dir, 10)
    before = weights(run.model)
    messages = []
    assert warm_start.warm_start(source, run.model, str(model_dir), manifest(data_dir), data_dir,
                                 log=messages.append) is None
    assert messages == [f"note: --init_checkpoint={source} is ignored: {model_dir} has "
                        "checkpoints of its own and the run resumes from them"]
    after = weights(run.model)
    assert all(np.array_equal(before[p], after[p]) for p in before)


def test_a_model_that_does_not_fit_is_listed_and_nothing_is_written(data_dir, source, tmp_path):
    model_dir = tmp_path / "m"
    run = runner(data_dir, model_dir, 5, d_model=32, n_layer=2)
    with pytest.raises(ValueError) as raised:
        warm_start.warm_start(source, run.model, str(model_dir), manifest(data_dir), data_dir)
    message = str(raised.value)
    assert message.startswith(f"--init_checkpoint={source}/checkpoints/ckpt-10 does not fit the "
                              "model (")
    assert ("backbone/embedding/table_0 is [258, 16] there, [258, 32] here" in message)
    assert "backbone/block_1/attention/query_kernel [32, 2, 8] is not in it" not in message
    # 12 variables of block_0 differ in shape, block_1 (13) is not in it, nor the wider table
    assert "model (26 of its variables or settings differ): " in message
    assert "; and 20 more." in message  # 6 listed by name, the rest counted
    assert message.endswith(f"Its model is --config={source}/config.json")
    assert "\n" not in message
    assert not model_dir.exists()


def test_another_vocabulary_is_named(data_dir, tmp_path):
    other = factories.TransfoXLLM(factories.data_config(data_dir, vocab_size=300))
    other.build((None, T))
    path = str(tmp_path / "other.keras")
    other.save(path)
    run = runner(data_dir, tmp_path / "m", 5)
    with pytest.raises(ValueError) as raised:
        warm_start.warm_start(path, run.model, str(tmp_path / "m"), manifest(data_dir), data_dir)
    message = str(raised.value)
    assert "backbone/embedding/table_0 is [300, 16] there, [258, 16] here" in message
    assert "softmax/bias is [300] there, [258] here" in message
    assert message.endswith(f"Its vocabulary has 300 tokens, --data_dir={data_dir} has 258: "
                            "prepare the data with the checkpoint's vocabulary")


def test_a_pre_lnorm_source_does_not_fit_a_post_lnorm_model(data_dir, tmp_path):
    other = factories.TransfoXLLM(factories.data_config(data_dir, pre_lnorm=True))
    other.build((None, T))
    path = str(tmp_path / "pre.keras")
    other.save(path)
    run = runner(data_dir, tmp_path / "m", 5)
    with pytest.raises(ValueError, match=r"\(1 of its variables or settings differ\): "
                                         r"pre_lnorm is True there, False here$"):
        warm_start.warm_start(path, run.model, str(tmp_path / "m"), manifest(data_dir), data_dir)


@pytest.mark.parametrize("init,needle", [
    ("missing.keras", "missing.keras: no such .keras file"),
    ("missing_dir", "missing_dir not found: give a .keras file, a model_dir or a checkpoint"),
    ("empty_dir", "empty_dir: no checkpoint in"),
    ("not_a.keras", "not_a.keras is not a readable .keras file"),
])
def test_an_init_checkpoint_that_cannot_be_read_is_one_error(data_dir, tmp_path, init, needle):
    (tmp_path / "empty_dir").mkdir()
    (tmp_path / "not_a.keras").write_bytes(b"not a zip file")
    run = runner(data_dir, tmp_path / "m", 5)
    with pytest.raises(ValueError, match="^--init_checkpoint=") as raised:
        warm_start.warm_start(str(tmp_path / init), run.model, str(tmp_path / "m"),
                              manifest(data_dir), data_dir)
    assert needle in str(raised.value) and "\n" not in str(raised.value)
    assert not (tmp_path / "m").exists()


# -- the command line -----------------------------------------------------------------------------

def cli_flags(data_dir, model_dir, steps=2):
    return [f"--data_dir={data_dir}", f"--model_dir={model_dir}", "--n_layer=1", "--d_model=16",
            "--n_head=2", "--d_head=8", "--d_inner=32", "--dropout=0.1", f"--tgt_len={T}",
            f"--mem_len={T}", f"--train_batch_size={STREAMS}", f"--train_steps={steps}",
            "--steps_per_loop=2", "--save_every=0", "--learning_rate=0.003",
            "--lease_settle=0"]  # no other trainer: no settle


def run_cli(*args):
    return factories.run_in_process("tfxl.train.main", *args)


def test_cli_warm_starts_and_refuses_what_does_not_fit(data_dir, source, tmp_path):
    started = run_cli(*cli_flags(data_dir, tmp_path / "m"), f"--init_checkpoint={source}")
    assert started.returncode == 0, started.stderr[-2000:]
    prefix = os.path.join(source, "checkpoints", "ckpt-10")
    assert f"warm start: model weights from {prefix}" in started.stdout
    assert json.loads((tmp_path / "m" / "metrics.json").read_text())["init_checkpoint"] == prefix

    dry = run_cli(*cli_flags(data_dir, tmp_path / "n"), f"--init_checkpoint={source}",
                  "--dry_run")
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert f"warm start: {prefix} fits this model\ndry run: nothing written" in dry.stdout
    assert not (tmp_path / "n").exists()

    for bad in ([f"--init_checkpoint={source}", "--d_model=32"],
                [f"--init_checkpoint={source}", "--d_model=32", "--dry_run"],
                [f"--init_checkpoint={tmp_path / 'missing'}"]):
        refused = run_cli(*cli_flags(data_dir, tmp_path / "n"), *bad)
        error = factories.assert_one_error_line(refused, "--init_checkpoint=")
        assert error.startswith("error: --init_checkpoint="), error
        assert not (tmp_path / "n").exists()


def test_warm_start_under_mirrored_gives_every_replica_the_weights(data_dir, source, tmp_path,
                                                                   mirrored):
    expected = weights(source_model(data_dir, source))
    path = str(tmp_path / "source.keras")
    source_model(data_dir, source).save(path)
    for init in (source, path):
        model = build_model(factories.data_config(data_dir), mirrored)
        warm_start.warm_start(init, model, str(tmp_path / "m"), manifest(data_dir), data_dir,
                              log=lambda *a: None)
        for name, variable in variables_by_path(model).items():
            copies = mirrored.experimental_local_results(variable.value)
            assert len(copies) == 2, name
            for copy in copies:
                np.testing.assert_array_equal(copy.numpy(), expected[name], err_msg=name)


def test_a_source_trained_on_another_vocabulary_of_the_same_size_is_refused(data_dir, source,
                                                                           tmp_path):
    copy = tmp_path / "source"
    tf.io.gfile.makedirs(str(copy / "checkpoints"))
    for name in ("config.json", *(f"checkpoints/{n}" for n in
                                  tf.io.gfile.listdir(os.path.join(source, "checkpoints")))):
        tf.io.gfile.copy(os.path.join(source, name), str(copy / name))
    with open(os.path.join(source, "data.json")) as f:
        record = json.load(f)
    (copy / "data.json").write_text(json.dumps({**record, "vocab_sha256": "0" * 64}))
    run = runner(data_dir, tmp_path / "m", 5)
    with pytest.raises(ValueError, match=f"has another vocabulary .* than the one {copy} was "
                                         "trained on"):
        warm_start.warm_start(str(copy), run.model, str(tmp_path / "m"), manifest(data_dir),
                              data_dir)


# The child, on JAX: a model of the data's config warm-started from each source in turn; the
# weights it got.
ON_JAX = """
import json, sys
import keras, numpy as np
tests, data_dir, model_dir, work, *sources = sys.argv[1:]
sys.path.insert(0, tests)
import factories
from tfxl import TransfoXLLM
from tfxl.checkpoints import warm_start
from tfxl.checkpoints.tree import variables_by_path
assert keras.backend.backend() == "jax", keras.backend.backend()
with open(f"{data_dir}/manifest.json") as f:
    manifest = json.load(f)
for i, source in enumerate(sources):
    model = TransfoXLLM(factories.data_config(data_dir))
    model.build((None, model.config.tgt_len))
    warm_start.warm_start(source, model, model_dir, manifest, data_dir)
    np.savez(f"{work}/weights_{i}.npz", **{path: keras.ops.convert_to_numpy(variable.value)
                                           for path, variable in variables_by_path(model).items()})
"""


@pytest.mark.large
@pytest.mark.subprocess
def test_warm_start_on_jax_from_a_tensorflow_model_dir_and_a_keras_file(data_dir, source,
                                                                        tmp_path):
    """The same weights as on TensorFlow, from the model_dir's training checkpoint and from
    the .keras file (tfxl/checkpoints/tree.py reads the one, Keras the other)."""
    expected = weights(source_model(data_dir, source))
    path = str(tmp_path / "source.keras")
    source_model(data_dir, source).save(path)
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": JAX_XLA_FLAGS}
    done = subprocess.run(
        [sys.executable, "-c", ON_JAX, os.path.dirname(os.path.abspath(__file__)), data_dir,
         str(tmp_path / "m"), str(tmp_path), source, path],
        env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    prefix = os.path.join(source, "checkpoints", "ckpt-10")
    assert f"warm start: model weights from {prefix}" in done.stdout
    assert f"warm start: model weights from {path}" in done.stdout
    for i in range(2):
        got = dict(np.load(tmp_path / f"weights_{i}.npz"))
        assert sorted(got) == sorted(expected)
        for name, value in expected.items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)
