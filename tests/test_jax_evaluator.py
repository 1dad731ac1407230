"""JaxEvaluator's host loop (one jitted `lax.scan` over up to steps_per_loop segments, its sums
read once per loop) against the evaluation it replaced, computed here segment by segment (one
jitted step per segment on the key/value ring, its sums read after each): on one device, on four
(DataParallel, a child process), and against TensorFlow's Evaluator on the same weights.

Runs in the JAX pass (the child processes' tests marked large: `make test-large`); the
TensorFlow and PyTorch passes skip it.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import factories
from backends import JAX_XLA_FLAGS

pytestmark = [pytest.mark.every_backend,
              pytest.mark.skipif(keras.backend.backend() != "jax",
                                 reason="JAX's evaluator: runs in the JAX pass")]

TESTS = os.path.dirname(os.path.abspath(__file__))
T = 8          # segment length of the data
STREAMS = 4    # the global batch
LOOP = 4       # steps_per_loop
RELATIVE = 1e-6
# name -> (evaluation settings, max_batches)
CONFIGS = {
    "whole split": (dict(tgt_len=T, mem_len=T, clamp_len=-1, same_length=False), None),
    "max_batches, re-cut, longer memory, same_length, clamp": (
        dict(tgt_len=T // 2, mem_len=3 * T, clamp_len=5, same_length=True), 2 * LOOP - 1),
    "one loop shorter than steps_per_loop": (
        dict(tgt_len=T, mem_len=2 * T, clamp_len=-1, same_length=False), LOOP - 1),
}


def write_data(root):
    """A tfxl-prepare data dir of repeated random blocks (the loss depends on what the memory
    holds), whose valid split is not a whole number of loops."""
    from tfxl.data.prepare import PrepareConfig, prepare
    rng = np.random.default_rng(0)
    for split, blocks in (("train", 20), ("valid", 40), ("test", 10)):
        text = np.repeat(rng.choice(np.frombuffer(b"abcdefgh", np.uint8), (blocks, T)), 3, 0)
        (root / f"{split}.txt").write_bytes(text.tobytes())
    out = root / "data"
    prepare(PrepareConfig(output_dir=str(out), train=[str(root / "train.txt")],
                          valid=[str(root / "valid.txt")], test=[str(root / "test.txt")],
                          tokenizer="bytes", tgt_len=T, num_streams=STREAMS), log=lambda *a: None)
    return str(out)


def model_config(data_dir):
    # A large init_std: predictions far from uniform, so the mean loss moves with every key.
    return factories.tiny_config(vocab_size=factories.vocab_size_of(data_dir), d_model=32,
                                 d_head=16, d_inner=64, tgt_len=T, mem_len=T, init_std=0.3)


def jax_evaluator(data_dir, weights=None):
    """The JaxEvaluator tfxl-train builds, data parallel over this process's devices, with
    `weights` (a .weights.h5) or the seeded initial ones."""
    from tfxl.data.manifest import load_manifest
    from tfxl.tpu.jax_mesh import resolve_distribution
    from tfxl.train.tasks.datasets import DistributedData
    from tfxl.train.loop.jax_evaluator import JaxEvaluator
    from tfxl.train.tasks.language_model import build_model
    strategy = resolve_distribution("data_parallel")
    model = build_model(model_config(data_dir), strategy)
    if weights is not None:
        model.load_weights(weights)
    data = DistributedData(strategy, data_dir, load_manifest(data_dir))
    return JaxEvaluator(model, strategy, data, STREAMS, steps_per_loop=LOOP)


def per_step(evaluator, split, settings, max_batches):
    """The pass segment by segment: one jitted step per segment, the ring passed in and out and
    the sums read after each step. {"loss", "tokens", "steps"}."""
    import jax
    from keras import ops
    s = evaluator.settings(**settings)
    model, strategy = evaluator.model, evaluator.strategy
    steps = evaluator.data.eval_steps(split, s["batch_size"], s["tgt_len"])
    steps = min(steps, max_batches) if max_batches else steps

    @jax.jit
    def step(trainable, non_trainable, memory, position_keys, batch):
        (nll, memory), _ = model.stateless_call(
            trainable, non_trainable, batch["inputs"], memory, reset=batch["reset"],
            targets=batch["targets"], training=False, same_length=s["same_length"],
            position_keys=position_keys)
        mask = ops.cast(batch["target_mask"], "float32")
        nll = ops.cast(nll, "float32") * mask
        return ops.sum(nll), ops.sum(mask), ops.sum(nll, axis=0), ops.sum(mask, axis=0), memory

    memory = jax.tree_util.tree_map(
        strategy.split_along_batch,
        model.init_key_value_ring(s["batch_size"], s["tgt_len"], s["mem_len"]))
    position_keys = model.position_keys(s["mem_len"] + s["tgt_len"], s["clamp_len"])
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    iterator = evaluator.batches(split, s)
    total = count = 0.0
    position_total = position_count = 0.0
    for _ in range(steps):
        batch = {key: strategy.global_array(value) for key, value in next(iterator).items()}
        nll_sum, tokens, nll_by_position, tokens_by_position, memory = step(
            trainable, non_trainable, memory, position_keys, batch)
        total, count = total + float(nll_sum), count + float(tokens)
        position_total = position_total + np.asarray(nll_by_position, np.float64)
        position_count = position_count + np.asarray(tokens_by_position, np.float64)
    return {"loss": total / count, "tokens": int(count), "steps": steps,
            "loss_by_position": (position_total / position_count).tolist()}


def both_paths(evaluator):
    """{config: {"loop": evaluate's result, "per_step": per_step's}} on the valid split."""
    return {name: {"loop": evaluator.evaluate("valid", max_batches=max_batches, **settings),
                   "per_step": per_step(evaluator, "valid", settings, max_batches)}
            for name, (settings, max_batches) in CONFIGS.items()}


def assert_same(got, want, relative=RELATIVE):
    assert got["tokens"] == want["tokens"] > 0
    assert got["loss"] == pytest.approx(want["loss"], rel=relative), (got, want)


# What a child process runs: both paths on its devices, from the parent's weights.
CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import jax
import keras
import test_jax_evaluator as t
keras.utils.set_random_seed(1234)
evaluator = t.jax_evaluator(sys.argv[2], sys.argv[3])
print("RESULT " + json.dumps({"devices": evaluator.strategy.num_replicas_in_sync,
                              "jax_devices": jax.device_count(),
                              "paths": t.both_paths(evaluator)}))
"""

# TensorFlow's Evaluator (tfxl-eval's: make_evaluator) on the same weights and data.
ON_TENSORFLOW = """
import json, sys
sys.path.insert(0, sys.argv[1])
import test_jax_evaluator as t
from tfxl.train.tasks.language_model import make_evaluator
import tensorflow as tf
data_dir, weights, model_dir = sys.argv[2:5]
evaluator = make_evaluator(t.model_config(data_dir), tf.distribute.get_strategy(), data_dir,
                           model_dir, t.STREAMS, steps_per_loop=t.LOOP)
evaluator.model.load_weights(weights)
print("RESULT " + json.dumps({name: evaluator.evaluate("valid", max_batches=max_batches,
                                                       **settings)
                              for name, (settings, max_batches) in t.CONFIGS.items()}))
"""


def child_result(script, *args, env):
    done = subprocess.run([sys.executable, "-c", script, TESTS, *map(str, args)],
                          capture_output=True, text=True, env={**os.environ, **env}, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_data(tmp_path_factory.mktemp("jax_eval"))


@pytest.fixture(scope="module")
def evaluated(data_dir, tmp_path_factory):
    """The one-device evaluator, both paths over every config, and its weights saved for the
    child processes."""
    keras.utils.set_random_seed(1234)
    evaluator = jax_evaluator(data_dir)
    weights = tmp_path_factory.mktemp("jax_eval_weights") / "model.weights.h5"
    evaluator.model.save_weights(weights)
    return evaluator, both_paths(evaluator), weights


def test_the_split_is_not_a_whole_number_of_loops(data_dir):
    evaluator = jax_evaluator(data_dir)
    steps = evaluator.data.eval_steps("valid", STREAMS, T)
    assert steps > 2 * LOOP and steps % LOOP, steps


@pytest.mark.parametrize("name", list(CONFIGS))
def test_one_compiled_loop_equals_the_pass_segment_by_segment(evaluated, name):
    _, paths, _ = evaluated
    assert_same(paths[name]["loop"], paths[name]["per_step"])
    settings, max_batches = CONFIGS[name]
    steps = paths[name]["per_step"]["steps"]
    assert paths[name]["loop"]["tokens"] == steps * STREAMS * settings["tgt_len"]
    assert max_batches is None or steps == max_batches


def test_the_memory_matters_here(evaluated):
    """So that the comparisons above test the ring carried through the scan and the loops: an
    evaluation without it differs by far more than their tolerance."""
    evaluator, paths, _ = evaluated
    settings, _ = CONFIGS["whole split"]
    no_memory = evaluator.evaluate("valid", **{**settings, "mem_len": 0})
    with_memory = paths["whole split"]["loop"]["loss"]
    assert abs(no_memory["loss"] - with_memory) > 100 * RELATIVE * with_memory


def test_a_pass_compiles_a_loop_of_each_length_once(data_dir, monkeypatch):
    """A whole split of 7 loops and a shorter last one: two traces; the next pass none."""
    from tfxl.train.loop.jax_evaluator import JaxEvaluator
    traced = []
    original = JaxEvaluator._loop_fn

    def counting(self, *args, **kwargs):
        traced.append(args[4]["inputs"].shape[0])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(JaxEvaluator, "_loop_fn", counting)
    evaluator = jax_evaluator(data_dir)
    settings, _ = CONFIGS["whole split"]
    first = evaluator.evaluate("valid", **settings)
    steps = evaluator.data.eval_steps("valid", STREAMS, T)
    assert sorted(traced) == [steps % LOOP, LOOP]
    assert evaluator.evaluate("valid", **settings) == first
    assert len(traced) == 2


@pytest.mark.large
@pytest.mark.subprocess
def test_four_devices_data_parallel_equal_the_pass_segment_by_segment(data_dir, evaluated):
    _, one_device, weights = evaluated
    result = child_result(CHILD, data_dir, weights, env={
        "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"{JAX_XLA_FLAGS} --xla_force_host_platform_device_count=4"})
    assert result["devices"] == result["jax_devices"] == 4
    for name, paths in result["paths"].items():
        assert_same(paths["loop"], paths["per_step"])
        assert_same(paths["loop"], one_device[name]["loop"], relative=1e-5)


@pytest.mark.large
@pytest.mark.subprocess
def test_the_result_equals_tensorflow_evaluators_on_the_same_weights(data_dir, evaluated,
                                                                     tmp_path):
    """tfxl-eval's result (loss, bpc, tokens and settings) from JAX's evaluator and from
    TensorFlow's, the same weights: equal to the backends' float32 precision."""
    _, paths, weights = evaluated
    on_tensorflow = child_result(ON_TENSORFLOW, data_dir, weights, tmp_path,
                                 env={"KERAS_BACKEND": "tensorflow"})
    for name, want in on_tensorflow.items():
        got = paths[name]["loop"]
        assert set(got) == set(want) and got["split"] == "valid"
        for key, value in want.items():
            if isinstance(value, float):
                assert got[key] == pytest.approx(value, rel=1e-5), (name, key, got, want)
            else:
                assert got[key] == value, (name, key, got, want)


def test_the_loss_by_position_equals_the_pass_segment_by_segment(data_dir):
    evaluator = jax_evaluator(data_dir)
    settings, max_batches = CONFIGS["max_batches, re-cut, longer memory, same_length, clamp"]
    got = evaluator.evaluate("valid", max_batches=max_batches, by_position=True, **settings)
    want = per_step(evaluator, "valid", settings, max_batches)
    assert len(got["loss_by_position"]) == settings["tgt_len"]
    np.testing.assert_allclose(got["loss_by_position"], want["loss_by_position"], rtol=1e-6)
