"""The paper's baselines through the tools: `tfxl-train --architecture=lstm|transformer` resumes
exactly after kill -9 in a save and after SIGTERM, TensorFlow and JAX train them to the same
losses, `tfxl-eval` and `tfxl-context` read their model_dirs, and the Transformer-XL-only tools
refuse them with one line."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import factories
from factories import STARTED, no_process_left_behind  # noqa: F401 (autouse)
from factories import assert_one_error_line, run_in_process, tiny_config, vocab_size_of
from tfxl.model_dir import check_or_store_config
from tfxl.train.records.train_log import read_train_log

T, STREAMS, STEPS = 8, 4, 60
ARCHITECTURES = ["lstm", "transformer"]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
LOSS_TOLERANCE = 1e-5  # TensorFlow against JAX, relative, per step


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return factories.random_bytes_data(tmp_path_factory.mktemp("baselines"), T, STREAMS,
                                       train_bytes=8000)


def model_flags(architecture):
    return [f"--architecture={architecture}", "--n_layer=2", "--d_model=16", "--n_head=2",
            "--d_head=8", "--d_inner=32", f"--tgt_len={T}", f"--mem_len={T}"]


def cli_flags(data_dir, model_dir, architecture, *extra, dropout=0.1):
    return [f"--data_dir={data_dir}", f"--model_dir={model_dir}", *model_flags(architecture),
            f"--dropout={dropout}", f"--train_batch_size={STREAMS}", f"--train_steps={STEPS}",
            "--steps_per_loop=2", "--save_every=10", "--learning_rate=0.01", "--seed=3",
            "--train_log_seconds=0", "--lease_settle=0", *extra]


def losses(model_dir):
    return {r["step"]: r["loss"] for r in read_train_log(str(model_dir))}


@pytest.fixture(scope="module")
def reference(data_dir, tmp_path_factory):
    """An uninterrupted run per architecture, in this process, trained on first use."""
    runs = {}

    def model_dir(architecture):
        if architecture not in runs:
            runs[architecture] = tmp_path_factory.mktemp(f"reference_{architecture}") / "m"
            done = run_in_process("tfxl.train.main",
                                  *cli_flags(data_dir, runs[architecture], architecture))
            assert done.returncode == 0, done.stderr[-3000:]
        return runs[architecture]
    return model_dir


def assert_resumed_exactly(model_dir, reference_dir):
    got, want = losses(model_dir), losses(reference_dir)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert got[step] == pytest.approx(want[step], abs=1e-6), step


@pytest.mark.large
@pytest.mark.subprocess
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_kill_9_in_a_save_then_the_rerun_continues_exactly(architecture, data_dir, reference,
                                                            tmp_path):
    model_dir, marker = tmp_path / "m", tmp_path / "in_save"
    proc = subprocess.Popen([sys.executable, "-c", factories.HANG_IN_SAVE,
                             "tensorflow.python.ops.gen_io_ops", "merge_v2_checkpoints",
                             "ckpt-20", str(marker),
                             *cli_flags(data_dir, model_dir, architecture)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    STARTED.append(proc)
    factories.kill_9_in_the_save(proc, marker, timeout=240)
    resumed = run_in_process("tfxl.train.main", *cli_flags(data_dir, model_dir, architecture))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr and "ckpt-10 at step 10" in resumed.stderr
    assert_resumed_exactly(model_dir, reference(architecture))


@pytest.mark.large
@pytest.mark.subprocess
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_sigterm_saves_and_the_rerun_continues_exactly(architecture, data_dir, reference,
                                                       tmp_path):
    model_dir = tmp_path / "m"
    proc = subprocess.Popen([sys.executable, "-m", "tfxl.train.main",
                             *cli_flags(data_dir, model_dir, architecture)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    STARTED.append(proc)
    deadline = time.time() + 300
    while not losses(model_dir) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, (proc.returncode, err[-3000:])
    stopped = [line for line in out.splitlines() if line.startswith("stopped by SIGTERM")]
    assert len(stopped) == 1, out[-2000:]
    step = max(losses(model_dir))
    assert 0 < step < STEPS
    resumed = run_in_process("tfxl.train.main", *cli_flags(data_dir, model_dir, architecture))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"at step {step}" in resumed.stderr
    assert_resumed_exactly(model_dir, reference(architecture))


@pytest.mark.large
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_tfxl_eval_reads_a_baselines_model_dir_whatever_the_segment_length(
        architecture, data_dir, reference):
    """Neither baseline's evaluation depends on the evaluation segment: the window and the state
    carry what each token is read with across segments."""
    results = []
    for tgt_len in (4, 8):
        done = run_in_process("tfxl.train.evaluate", f"--data_dir={data_dir}",
                              f"--model_dir={reference(architecture)}", f"--tgt_len={tgt_len}")
        assert done.returncode == 0, done.stderr[-3000:]
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert results[0]["tokens"] == results[1]["tokens"] > 0
    assert results[0]["loss"] == pytest.approx(results[1]["loss"], rel=1e-5)
    assert results[0]["checkpoint"].endswith(f"ckpt-{STEPS}")


@pytest.mark.large
def test_tfxl_context_names_each_architecture(data_dir, reference, tmp_path):
    paths = [str(reference(architecture)) for architecture in ARCHITECTURES]
    done = run_in_process("tfxl.analysis.context_main", *(f"--model={p}" for p in paths),
                          f"--data_dir={data_dir}", "--contexts=4,8,12,16", "--positions=16",
                          "--batch_size=8", f"--output_dir={tmp_path}")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "context.json").read_text())
    assert [result["models"][p]["architecture"] for p in paths] == ARCHITECTURES
    vanilla = result["models"][paths[1]]["loss"]
    assert vanilla[1:] == pytest.approx([vanilla[1]] * 3, abs=1e-6)  # capped at tgt_len = 8


@pytest.fixture(scope="module")
def init_checkpoints(data_dir, tmp_path_factory):
    """{architecture: one set of initial weights for both backends} (Keras' initializers draw
    other numbers on each)."""
    from tfxl.models import build_language_model
    saved = {}
    for architecture in ARCHITECTURES:
        config = tiny_config(vocab_size=vocab_size_of(data_dir), architecture=architecture,
                             n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, tgt_len=T,
                             mem_len=T)
        model = build_language_model(config, name="transfo_xl_lm")
        saved[architecture] = tf.train.Checkpoint(model=model).save(
            str(tmp_path_factory.mktemp(f"init_{architecture}") / "init"))
    return saved


@pytest.mark.large
@pytest.mark.subprocess
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_jax_trains_a_baseline_to_tensorflows_losses(architecture, data_dir, init_checkpoints,
                                                     tmp_path):
    flags = [f"--init_checkpoint={init_checkpoints[architecture]}", "--eval_every=20",
             "--max_eval_batches=2"]
    on_tf = run_in_process("tfxl.train.main",
                           *cli_flags(data_dir, tmp_path / "tf", architecture, *flags))
    assert on_tf.returncode == 0, on_tf.stderr[-3000:]
    env = dict(ENV, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    on_jax = factories.run_tool("tfxl.train.main",
                                *cli_flags(data_dir, tmp_path / "jax", architecture, *flags),
                                env=env, timeout=600)
    assert on_jax.returncode == 0, on_jax.stderr[-3000:]
    tf_losses, jax_losses = losses(tmp_path / "tf"), losses(tmp_path / "jax")
    assert sorted(jax_losses) == sorted(tf_losses) == list(range(1, STEPS + 1))
    a = np.array([tf_losses[s] for s in sorted(tf_losses)])
    b = np.array([jax_losses[s] for s in sorted(jax_losses)])
    relative = np.abs(a - b) / np.abs(a)
    print(f"{architecture}: largest relative TF/JAX loss difference over {STEPS} steps: "
          f"{relative.max():.2e}")
    assert relative.max() <= LOSS_TOLERANCE, (relative.max(), a, b)
    assert abs(a[-1] - a[0]) > 1e-2  # training moved
    valid = [json.loads((tmp_path / side / "metrics.json").read_text())["valid"]["loss"]
             for side in ("tf", "jax")]
    assert valid[1] == pytest.approx(valid[0], rel=LOSS_TOLERANCE)


# -- what only Transformer-XL does ----------------------------------------------------------------

@pytest.fixture(scope="module")
def lstm_model_dir(tmp_path_factory):
    """A baseline's model_dir as far as the tools read it before its weights: config.json."""
    model_dir = tmp_path_factory.mktemp("lstm_dir")
    check_or_store_config(str(model_dir), tiny_config(architecture="lstm"))
    return model_dir


@pytest.mark.parametrize("module, flags", [
    ("tfxl.serving.export_main", ["--output_dir={tmp}/export"]),
    ("tfxl.serving.generate_main", ["--prompt=ab", "--max_new_tokens=2", "--data_dir={data}"]),
])
def test_the_transformer_xl_tools_refuse_a_baseline_with_one_line(module, flags, lstm_model_dir,
                                                                  data_dir, tmp_path):
    done = run_in_process(module, f"--model={lstm_model_dir}",
                          *(flag.format(tmp=tmp_path, data=data_dir) for flag in flags))
    assert_one_error_line(done, "holds a 'lstm' model (a baseline)",
                          "Transformer-XL models only")


def test_convert_and_a_bad_architecture_are_refused_with_one_line(data_dir, tmp_path):
    (tmp_path / "model.bin").write_bytes(b"")  # refused before it is read
    done = run_in_process("tfxl.convert.main", "--format=pytorch",
                          f"--input={tmp_path / 'model.bin'}",
                          f"--output={tmp_path / 'out.keras'}", "--preset=tiny",
                          "--architecture=lstm")
    assert_one_error_line(done, "--architecture=lstm: tfxl-convert builds Transformer-XL "
                                "models only")
    done = run_in_process("tfxl.train.main", f"--data_dir={data_dir}",
                          f"--model_dir={tmp_path / 'm'}", "--architecture=gru")
    assert_one_error_line(done, "architecture")


@pytest.mark.large
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_two_mirrored_replicas_train_and_evaluate_a_baseline_as_one_device(
        architecture, data_dir, tmp_path, mirrored):
    """Each replica keeps its own streams' memory (the LSTM's state, the vanilla Transformer's
    evaluation window): the per-step losses and the evaluation are one device's (no dropout:
    a replica's masks are drawn over its own rows)."""
    from tfxl.train.loop.optimization import OptimizerParams
    config = tiny_config(vocab_size=vocab_size_of(data_dir), architecture=architecture,
                         n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, tgt_len=T,
                         mem_len=T, eval_tgt_len=4, init_std=0.1)
    runs = {}
    for name, strategy in (("one", tf.distribute.get_strategy()), ("two", mirrored)):
        run = factories.language_model_run(
            config, strategy=strategy, data_dir=data_dir, model_dir=str(tmp_path / name),
            global_batch=STREAMS, optimizer=OptimizerParams(learning_rate=0.01, train_steps=12),
            steps_per_loop=4, lease=factories.fast_lease())
        run.train(save_every=12)
        runs[name] = (losses(tmp_path / name), run.evaluate("valid"))
    (one, one_eval), (two, two_eval) = runs["one"], runs["two"]
    assert sorted(two) == sorted(one) == list(range(1, 13))
    np.testing.assert_allclose([two[s] for s in sorted(two)], [one[s] for s in sorted(one)],
                               rtol=1e-5)
    assert two_eval["tokens"] == one_eval["tokens"] > 0
    assert two_eval["loss"] == pytest.approx(one_eval["loss"], rel=1e-5)
