"""tfxl-train on JAX against tfxl-train on TensorFlow: the same per-step losses from the same
initial weights and data, on 1, 4 and 8 simulated devices, data and model parallel.

Both trainers run as the user runs them (processes); both start from one `--init_checkpoint`
written here (Keras' initializers draw other numbers on each backend), and read their per-step
losses from the run's train log.
"""

import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from factories import random_bytes_data, run_tool, tiny_config, vocab_size_of

STEPS = 20
MODEL_FLAGS = ["--preset=tiny", "--tgt_len=8", "--mem_len=8", "--n_layer=2", "--d_model=16",
               "--n_head=4", "--d_head=4", "--d_inner=32", "--init_std=0.1"]
RUN_FLAGS = ["--train_batch_size=8", f"--train_steps={STEPS}", "--steps_per_loop=5",
             "--save_every=10", "--learning_rate=0.01", "--warmup_steps=2", "--seed=3",
             f"--schedule_steps={STEPS}"]
LOSS_TOLERANCE = 1e-5  # relative, per step


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return random_bytes_data(tmp_path_factory.mktemp("jax_data"), tgt_len=8, num_streams=8)


@pytest.fixture(scope="module")
def init_checkpoint(data_dir, tmp_path_factory):
    """One set of initial weights for both backends: a TensorFlow checkpoint of the model the
    flags describe."""
    from tfxl import TransfoXLLM
    config = tiny_config(vocab_size=vocab_size_of(data_dir), tgt_len=8, mem_len=8, n_layer=2,
                         d_model=16, n_head=4, d_head=4, d_inner=32, init_std=0.1)
    model = TransfoXLLM(config, name="transfo_xl_lm")
    return tf.train.Checkpoint(model=model).save(
        str(tmp_path_factory.mktemp("jax_init") / "init"))


def train(data_dir, model_dir, init_checkpoint, *flags, backend="tensorflow", devices=1):
    env = dict(os.environ, KERAS_BACKEND=backend)
    if backend == "jax":
        env.update(JAX_PLATFORMS="cpu",
                   XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    done = run_tool("tfxl.train.main", f"--data_dir={data_dir}", f"--model_dir={model_dir}",
                    f"--init_checkpoint={init_checkpoint}", *MODEL_FLAGS, *RUN_FLAGS, *flags,
                    env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def train_log(model_dir):
    lines = [json.loads(line) for name in sorted(os.listdir(model_dir / "train_log"))
             for line in (model_dir / "train_log" / name).read_text().splitlines()]
    return {line["step"]: line for line in lines}


class TensorFlowRuns(dict):
    """The TensorFlow trainer's log for a --dropout, trained when first asked for."""

    def __init__(self, data_dir, init_checkpoint, tmp_path_factory):
        super().__init__()
        self.args = data_dir, init_checkpoint, tmp_path_factory

    def __missing__(self, dropout):
        data_dir, init_checkpoint, tmp_path_factory = self.args
        model_dir = tmp_path_factory.mktemp(f"tf_{dropout}")
        train(data_dir, model_dir, init_checkpoint, f"--dropout={dropout}", "--dropatt=0")
        self[dropout] = train_log(model_dir)
        return self[dropout]


@pytest.fixture(scope="module")
def tensorflow_runs(data_dir, init_checkpoint, tmp_path_factory):
    return TensorFlowRuns(data_dir, init_checkpoint, tmp_path_factory)


def assert_same_losses(jax_log, tf_log):
    assert sorted(jax_log) == list(range(1, STEPS + 1))
    jax_losses = np.array([jax_log[s]["loss"] for s in sorted(jax_log)])
    tf_losses = np.array([tf_log[s]["loss"] for s in sorted(tf_log)])
    relative = np.abs(jax_losses - tf_losses) / np.abs(tf_losses)
    print(f"largest relative loss difference over {STEPS} steps: {relative.max():.2e}")
    assert relative.max() <= LOSS_TOLERANCE, (relative.max(), jax_losses, tf_losses)
    # Training moved: a run that never updated its weights would match step 1 only.
    assert abs(tf_losses[-1] - tf_losses[0]) > 1e-2
    return relative.max()


@pytest.mark.parametrize("devices, strategy", [
    pytest.param(4, "data_parallel"),
    pytest.param(1, "data_parallel", marks=pytest.mark.large),
    pytest.param(8, "data_parallel", marks=pytest.mark.large),
    pytest.param(4, "model_parallel", marks=pytest.mark.large),
    pytest.param(8, "model_parallel", marks=pytest.mark.large),
])
def test_jax_losses_equal_tensorflow_losses(devices, strategy, data_dir, init_checkpoint,
                                            tensorflow_runs, tmp_path):
    model_dir = tmp_path / "jax"
    train(data_dir, model_dir, init_checkpoint, "--dropout=0", "--dropatt=0",
          f"--strategy={strategy}", "--model_parallel=2", backend="jax", devices=devices)
    assert_same_losses(train_log(model_dir), tensorflow_runs["0"])
    run = json.loads((model_dir / "run.json").read_text())
    assert run["settings"]["strategy"] == strategy
    assert run["settings"]["replicas"] == (devices if strategy == "data_parallel"
                                           else devices // 2)


@pytest.mark.large
def test_jax_dropout_masks_equal_tensorflow_masks(data_dir, init_checkpoint, tensorflow_runs,
                                                  tmp_path):
    """The counter-hash dropout draws its masks from the seed alone: the same on both."""
    model_dir = tmp_path / "jax"
    train(data_dir, model_dir, init_checkpoint, "--dropout=0.2", "--dropatt=0", backend="jax",
          devices=2)
    assert_same_losses(train_log(model_dir), tensorflow_runs["0.2"])
    dropped, kept = tensorflow_runs["0.2"], tensorflow_runs["0"]
    assert dropped[STEPS]["loss"] != kept[STEPS]["loss"]  # dropout was on


@pytest.mark.large
def test_tensorflow_tools_read_a_jax_run(data_dir, init_checkpoint, tensorflow_runs, tmp_path):
    """A JAX run's checkpoint is a TensorFlow checkpoint: tfxl-eval reads it, and a TensorFlow
    run resumes it step for step (weights, optimizer, memory, seeds)."""
    model_dir = tmp_path / "jax"
    train(data_dir, model_dir, init_checkpoint, "--dropout=0", "--dropatt=0",
          f"--train_steps={STEPS // 2}", backend="jax", devices=2)
    assert list((model_dir / "train").glob("events.out.tfevents.*"))  # TensorBoard scalars
    evaluated = run_tool("tfxl.train.evaluate", f"--data_dir={data_dir}",
                         f"--model_dir={model_dir}", "--max_eval_batches=2")
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout.strip().splitlines()[-1])["tokens"] > 0
    # The TensorFlow trainer continues the JAX run (a changed strategy: --allow_run_changes).
    train(data_dir, model_dir, init_checkpoint, "--dropout=0", "--dropatt=0",
          "--allow_run_changes")
    assert_same_losses(train_log(model_dir), tensorflow_runs["0"])


def test_layout_map_splits_heads_inner_and_features_where_the_axis_divides():
    import keras
    from tfxl import TransfoXLLM
    from tfxl.config import TransfoXLConfig
    config = TransfoXLConfig(vocab_size=40, n_layer=1, d_model=16, n_head=4, d_head=4,
                             d_inner=30, d_embed=16, cutoffs=(10, 25), div_val=2,
                             tgt_len=8, mem_len=8)
    mesh = keras.distribution.DeviceMesh((2, 2), ("batch", "model"), ["cpu:0"] * 4)
    layout_map = TransfoXLLM.get_layout_map(config, mesh)
    axes = {v.path.split("/", 1)[1]: layout_map[v.path].axes
            for v in TransfoXLLM(config).weights if layout_map[v.path] is not None}
    assert axes["backbone/block_0/attention/query_kernel"] == (None, "model", None)
    assert axes["backbone/block_0/attention/position_kernel"] == (None, "model", None)
    assert axes["backbone/block_0/attention/output_kernel"] == ("model", None, None)
    assert axes["backbone/block_0/feed_forward/inner/kernel"] == (None, "model")
    assert axes["backbone/block_0/feed_forward/outer/kernel"] == ("model", None)
    # Tables of 16, 8 and 4 features: each split along its features.
    assert [axes[f"backbone/embedding/table_{i}"] for i in range(3)] == [(None, "model")] * 3
    three = keras.distribution.DeviceMesh((1, 3), ("batch", "model"), ["cpu:0"] * 3)
    layout_map = TransfoXLLM.get_layout_map(config, three)  # 4 heads, 16 features: whole
    assert layout_map["transfo_xl_lm/backbone/block_0/attention/query_kernel"].axes == (
        None, None, None)
    assert layout_map["transfo_xl_lm/backbone/block_0/feed_forward/inner/kernel"].axes == (
        None, "model")  # 30 = 3 x 10


MODEL_PARALLEL_LAYOUT = """
import json, sys
from tfxl.tpu.jax_mesh import resolve_distribution
from tfxl import TransfoXLLM
from tfxl.config import TransfoXLConfig
config = TransfoXLConfig(vocab_size=40, n_layer=1, d_model=16, n_head=4, d_head=4, d_inner=32,
                         tgt_len=8, mem_len=8)
distribution = resolve_distribution(
    "model_parallel", model_parallel=2,
    layout_map=lambda mesh: TransfoXLLM.get_layout_map(config, mesh))
with distribution.scope():
    model = TransfoXLLM(config)
print(json.dumps({v.path.split("/", 1)[1]: [str(a) for a in v.value.sharding.spec]
                  for v in model.weights}))
"""


def test_model_parallel_places_the_weights_split_on_the_mesh():
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", MODEL_PARALLEL_LAYOUT], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    specs = json.loads(done.stdout.strip().splitlines()[-1])
    assert specs["backbone/block_0/attention/key_kernel"][:2] == ["None", "model"]
    assert specs["backbone/block_0/feed_forward/outer/kernel"][:1] == ["model"]


@pytest.mark.large
def test_jax_bfloat16_losses_equal_tensorflow_to_bfloat16_precision(data_dir, init_checkpoint,
                                                                      tmp_path):
    flags = ["--dropout=0", "--dropatt=0", "--mixed_precision=mixed_bfloat16"]
    train(data_dir, tmp_path / "tf", init_checkpoint, *flags)
    train(data_dir, tmp_path / "jax", init_checkpoint, *flags, backend="jax", devices=4)
    tf_log, jax_log = train_log(tmp_path / "tf"), train_log(tmp_path / "jax")
    tf_losses = np.array([tf_log[s]["loss"] for s in sorted(tf_log)])
    jax_losses = np.array([jax_log[s]["loss"] for s in sorted(jax_log)])
    relative = np.abs(jax_losses - tf_losses).max() / np.abs(tf_losses).min()
    print(f"bfloat16: largest relative loss difference over {STEPS} steps: {relative:.2e}")
    assert relative <= 1e-2


LOAD_ON_JAX = """
import sys
import numpy as np
from tfxl.checkpoints.loading import load_language_model
model = load_language_model(sys.argv[1])
np.savez(sys.argv[2], *[np.asarray(v.value) for v in model.weights])
"""


@pytest.mark.large
def test_a_model_dir_loads_on_either_backend_with_the_same_weights(data_dir, init_checkpoint,
                                                                   tmp_path):
    """load_language_model reads a JAX run's model_dir on TensorFlow and on JAX alike."""
    import subprocess
    import sys
    from tfxl.checkpoints.loading import load_language_model
    model_dir = tmp_path / "jax"
    train(data_dir, model_dir, init_checkpoint, "--train_steps=5", backend="jax")
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", LOAD_ON_JAX, str(model_dir),
                           str(tmp_path / "jax.npz")], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    on_jax = np.load(tmp_path / "jax.npz")
    on_tensorflow = load_language_model(str(model_dir)).weights
    for i, variable in enumerate(on_tensorflow):
        np.testing.assert_array_equal(variable.numpy(), on_jax[f"arr_{i}"])


@pytest.mark.large
def test_a_diverged_jax_run_exits_3_naming_the_step(data_dir, tmp_path):
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    done = run_tool("tfxl.train.main", f"--data_dir={data_dir}", f"--model_dir={tmp_path}",
                    *MODEL_FLAGS, *RUN_FLAGS, "--learning_rate=1e30", "--clip=1e30",
                    "--warmup_steps=0", env=env, timeout=600)
    assert done.returncode == 3, done.stderr
    assert re.search(r"non-finite loss \S+ at step \d+", done.stderr), done.stderr
