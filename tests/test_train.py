"""The trainer: recurrence end to end, strategies agree, resume is exact, failures are clean."""

import functools
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import factories
from factories import run_in_process
from tfxl.data.prepare import PrepareConfig, prepare
from tfxl.train.loop.run import TrainingDiverged
from tfxl.model_dir import check_or_store_config
from tfxl.train.loop.optimization import OptimizerParams
from tfxl.train.records.train_log import read_train_log

T = 8          # segment length of the test data
STREAMS = 8    # streams per split
REPEATS = 4    # each random block appears this many times in a row


def copy_task_text(n_blocks, seed):
    """Random 8-letter-alphabet blocks of length T, each repeated REPEATS times.

    A repeat is predictable only from the previous segment, i.e. only through memory.
    """
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"abcdefgh", np.uint8)
    blocks = rng.choice(letters, size=(n_blocks, T))
    return np.repeat(blocks, REPEATS, axis=0).tobytes()


@pytest.fixture(scope="module")
def copy_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("copy")
    # A fixed seed per split: the thresholds below must see the same data in every process
    # (hash(str) changes with PYTHONHASHSEED).
    for seed, (split, blocks) in enumerate((("train", 4000), ("valid", 200), ("test", 200))):
        (root / f"{split}.txt").write_bytes(copy_task_text(blocks, seed))
    out = root / "data"
    prepare(PrepareConfig(output_dir=str(out), train=[str(root / "train.txt")],
                          valid=[str(root / "valid.txt")], test=[str(root / "test.txt")],
                          tokenizer="bytes", tgt_len=T, num_streams=STREAMS), log=lambda *a: None)
    return str(out)


# The copy task's model (its thresholds were set with it): wider than factories.data_config's.
COPY_TASK_MODEL = dict(n_layer=2, d_model=32, d_head=16, d_inner=64, dropout=0.0, init_std=0.05)


def copy_task_config(data_dir, **overrides):
    return factories.data_config(data_dir, tgt_len=T, **{**COPY_TASK_MODEL, **overrides})


def train_losses(data_dir, model_dir, strategy=None, steps=20, batch=STREAMS,
                 jit_compile=False, lr=3e-3, steps_per_loop=10, **config):
    strategy = strategy or tf.distribute.get_strategy()
    cfg = copy_task_config(data_dir, **config)
    runner = factories.language_model_run(
        cfg, strategy=strategy, data_dir=data_dir, model_dir=str(model_dir), global_batch=batch,
        optimizer=OptimizerParams(learning_rate=lr, train_steps=steps, min_lr_ratio=1.0),
        jit_compile=jit_compile, steps_per_loop=steps_per_loop, lease=factories.fast_lease())
    metrics = runner.train(save_every=steps)
    return np.array([r["loss"] for r in read_train_log(str(model_dir))]), runner, metrics


PLAIN_STEPS = 12  # two host loops of train_losses' 10 steps: 10, then 2


@pytest.fixture(scope="module")
def plain_run(copy_data, tmp_path_factory):
    """One-device training of the copy task's model for PLAIN_STEPS, once per file (the run seeds
    its own weights): the reference of the strategy and XLA tests, and the run whose memory,
    checkpoint and TensorBoard scalars are checked. Returns (losses, runner, model_dir)."""
    model_dir = tmp_path_factory.mktemp("plain") / "m"
    losses, runner, _ = train_losses(copy_data, model_dir, steps=PLAIN_STEPS)
    return losses, runner, model_dir


@pytest.mark.large
def test_memory_solves_the_copy_task_that_no_memory_cannot(copy_data, tmp_path):
    steps = 400  # in host loops of 100 steps: the same losses as loops of 10, less host work
    with_memory, runner, _ = train_losses(copy_data, tmp_path / "mem", steps=steps, mem_len=T,
                                          n_layer=1, steps_per_loop=100)
    without, runner0, _ = train_losses(copy_data, tmp_path / "nomem", steps=steps, mem_len=0,
                                       n_layer=1, steps_per_loop=100)
    ev_mem = runner.evaluate("valid")["loss"]
    ev_none = runner0.evaluate("valid")["loss"]
    # Three quarters of all tokens repeat the token T positions back, in the previous segment:
    # without memory nothing beats ln(8) = 2.08 nats; with it the loss tends to ln(8) / 4 = 0.52.
    assert ev_none > 1.95, ev_none
    assert ev_mem < 1.6, (ev_mem, ev_none)
    assert with_memory[-50:].mean() < without[-50:].mean() - 0.4


@pytest.mark.large
def test_mirrored_two_replicas_equal_one_device(copy_data, tmp_path, mirrored, plain_run):
    one = plain_run[0]
    two, runner, _ = train_losses(copy_data, tmp_path / "two", strategy=mirrored,
                                  steps=PLAIN_STEPS)
    np.testing.assert_allclose(two, one, atol=1e-5, rtol=1e-5)
    # Each replica holds its own memory rows (per-replica state, b = B / 2 rows each).
    valid = runner.train_step.memory.valid
    per_replica = runner.strategy.experimental_local_results(valid.value)
    assert len(per_replica) == 2 and per_replica[0].shape == (STREAMS // 2, T)


@pytest.mark.large
def test_resume_under_mirrored_continues_step_for_step(copy_data, tmp_path, mirrored):
    """Two replicas on one host: the resumed input position counts both replicas' batches."""
    def run(model_dir, steps):
        strategy = mirrored
        cfg = copy_task_config(copy_data, n_layer=1, dropout=0.1)
        runner = factories.language_model_run(
            cfg, strategy=strategy, data_dir=copy_data, model_dir=str(model_dir),
            global_batch=STREAMS,
            optimizer=OptimizerParams(learning_rate=3e-3, train_steps=steps, min_lr_ratio=1.0),
            steps_per_loop=3, lease=factories.fast_lease())
        runner.train(save_every=6)
        return logged_losses(model_dir)

    straight = run(tmp_path / "straight", 12)
    run(tmp_path / "resumed", 6)
    resumed = run(tmp_path / "resumed", 12)
    assert sorted(resumed) == list(range(1, 13))
    for step in range(7, 13):
        assert resumed[step] == pytest.approx(straight[step], abs=1e-5), step


@pytest.mark.large
def test_jit_compile_agrees_with_eager_steps(copy_data, tmp_path, plain_run):
    plain = plain_run[0]
    xla, _, _ = train_losses(copy_data, tmp_path / "xla", steps=PLAIN_STEPS, jit_compile=True)
    np.testing.assert_allclose(xla, plain, atol=1e-4, rtol=1e-4)


def test_memory_survives_host_loops_and_checkpoints(plain_run):
    runner = plain_run[1]
    before = runner.train_step.memory.gather()
    assert before.valid.numpy().all()  # carried across the two host loops, never reset
    runner.train_step.memory.clear()
    runner.restore()
    after = runner.train_step.memory.gather()
    np.testing.assert_array_equal(after.valid.numpy(), before.valid.numpy())
    np.testing.assert_allclose(after.states.numpy(), before.states.numpy())


def test_the_dropout_seeds_are_checkpointed_under_their_keys(copy_data, tmp_path):
    """`rng/seed_<i>` in model.non_trainable_variables order, the keys a run on either backend
    writes and reads (tfxl/checkpoints/training.py): a resumed run continues the same dropout
    stream."""
    _, runner, _ = train_losses(copy_data, tmp_path / "m", steps=4, dropout=0.1)
    latest = runner.checkpoint.manager.latest_checkpoint
    names = [name for name, _ in tf.train.list_variables(latest) if name.startswith("rng/")]
    states = [v for v in runner.model.non_trainable_variables if "seed_generator_state" in v.path]
    assert len(names) == len(states) > 0
    reader = tf.train.load_checkpoint(latest)
    for i, state in enumerate(states):
        np.testing.assert_array_equal(
            reader.get_tensor(f"rng/seed_{i}/.ATTRIBUTES/VARIABLE_VALUE"), state.numpy())


def test_both_training_memories_have_the_one_protocol_of_the_training_checkpoint():
    """TensorFlow's and JAX's training memory implement `TrainingMemory` under its names and
    parameters, so that one `TrainingCheckpoint.restore` serves both."""
    import inspect
    from tfxl.checkpoints.training import TrainingCheckpoint, TrainingMemory
    from tfxl.train.loop.jax_train_step import JaxTrainingMemory
    from tfxl.train.loop.memory_state import CheckpointedReplicaMemory
    methods = [name for name, value in vars(TrainingMemory).items()
               if inspect.isfunction(value) and not name.startswith("_")]
    assert sorted(methods) == ["checkpoint_shapes", "restore_from_checkpoint",
                               "save_to_checkpoint"]
    for holder in (CheckpointedReplicaMemory, JaxTrainingMemory):
        assert TrainingMemory in holder.__mro__
        for name in methods:
            assert getattr(holder, name) is not getattr(TrainingMemory, name), (holder, name)
            assert (list(inspect.signature(getattr(holder, name)).parameters)
                    == list(inspect.signature(getattr(TrainingMemory, name)).parameters))
    assert set(TrainingMemory.__annotations__) == {"checkpointed"}
    assert isinstance(vars(JaxTrainingMemory)["checkpointed"], functools.cached_property)
    assert "restore" in vars(TrainingCheckpoint) and TrainingCheckpoint.__subclasses__() == []


def test_the_memory_comes_back_from_its_checkpoint_values_row_for_row(mirrored):
    """Each of two replicas takes its own rows of the global values a checkpoint holds, in
    replica order (`restore_from_checkpoint`), and `save_to_checkpoint` gathers them back."""
    from tfxl.layers.memory import LayerInputMemory
    from tfxl.train.loop.memory_state import CheckpointedReplicaMemory
    b, m, d = 2, 3, 4
    empty = LayerInputMemory(tf.zeros((b, 1, m, d)), tf.zeros((b, m), tf.bool))
    memory = CheckpointedReplicaMemory(mirrored, empty, "test_memory")
    assert memory.checkpoint_shapes() == {"states": (2 * b, 1, m, d), "valid": (2 * b, m)}
    states = np.arange(2 * b * m * d, dtype=np.float32).reshape(2 * b, 1, m, d)
    valid = np.arange(2 * b * m).reshape(2 * b, m) % 3 == 0
    memory.restore_from_checkpoint({"states": tf.constant(states), "valid": tf.constant(valid)})
    per_replica = mirrored.experimental_local_results(memory.variables.valid.value)
    np.testing.assert_array_equal(per_replica[1].numpy(), valid[b:])
    memory.save_to_checkpoint()
    np.testing.assert_array_equal(memory.checkpointed.states.numpy(), states)
    np.testing.assert_array_equal(memory.checkpointed.valid.numpy(), valid)


def common_flags(data_dir, model_dir, steps):
    return [f"--data_dir={data_dir}", f"--model_dir={model_dir}", "--n_layer=1",
            "--d_model=32", "--n_head=2", "--d_head=16", "--d_inner=64", "--dropout=0.1",
            f"--tgt_len={T}", f"--mem_len={T}", f"--train_batch_size={STREAMS}",
            f"--train_steps={steps}", "--steps_per_loop=1", "--save_every=25",
            "--learning_rate=0.003", "--lease_settle=0"]  # no other trainer: no settle


def logged_losses(model_dir):
    return {r["step"]: r["loss"] for r in read_train_log(str(model_dir))}


@pytest.mark.large
def test_nan_loss_stops_with_the_step_and_keeps_the_checkpoint(copy_data, tmp_path):
    model_dir = tmp_path / "nan"
    flags = common_flags(copy_data, model_dir, 200)
    flags[-1] = "--learning_rate=1e30"
    flags += ["--clip=1e30", "--save_every=1"]
    result = run_in_process("tfxl.train.main", *flags)
    assert result.returncode == 3, result.stderr[-2000:]
    assert "non-finite loss" in result.stderr and "at step" in result.stderr
    failed_step = int(result.stderr.split("at step ")[1].split(";")[0])
    latest = tf.train.latest_checkpoint(str(model_dir / "checkpoints"))
    assert latest and int(latest.rsplit("-", 1)[1]) == failed_step - 1
    reader = tf.train.load_checkpoint(latest)
    values = [reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
              if k.startswith("model/") and "VARIABLE_VALUE" in k]
    assert values and all(np.isfinite(v).all() for v in values if v.dtype.kind == "f")


@pytest.mark.parametrize("extra,needle", [
    (["--no_such_flag=1"], "no_such_flag"),
    (["--data_dir=/nonexistent/dir"], "/nonexistent/dir"),
    ([f"--tgt_len={2 * T}"], "tgt_len"),
    (["--train_batch_size=3"], "batch"),
    (["--strategy=tpu"], "--tpu"),
])
def test_bad_flags_fail_with_a_clear_message(copy_data, tmp_path, extra, needle):
    result = run_in_process("tfxl.train.main", *common_flags(copy_data, tmp_path / "bad", 5),
                            *extra)
    assert result.returncode != 0
    assert needle in result.stderr
    assert "Traceback" not in result.stderr


def test_resuming_with_another_model_is_refused(copy_data, tmp_path):
    model_dir = tmp_path / "m"
    check_or_store_config(str(model_dir), copy_task_config(copy_data))
    with pytest.raises(ValueError, match=r"d_model: model_dir has 32, flags give 48"):
        check_or_store_config(str(model_dir), copy_task_config(copy_data, d_model=48))
    result = run_in_process("tfxl.train.main", *common_flags(copy_data, model_dir, 5),
                            "--d_model=48")
    assert result.returncode == 2 and "d_model" in result.stderr


def test_diverged_error_type(copy_data, tmp_path):
    cfg = copy_task_config(copy_data)
    runner = factories.language_model_run(
        cfg, data_dir=copy_data, model_dir=str(tmp_path), global_batch=STREAMS,
        optimizer=OptimizerParams(learning_rate=1e30, clip=1e30, train_steps=50),
        lease=factories.fast_lease())
    with pytest.raises(TrainingDiverged, match="at step"):
        runner.train()


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_training_runs_and_learns(copy_data, tmp_path, policy):
    cfg = copy_task_config(copy_data, n_layer=1)
    runner = factories.language_model_run(
        cfg, data_dir=copy_data, model_dir=str(tmp_path), global_batch=STREAMS,
        optimizer=OptimizerParams(learning_rate=3e-3, train_steps=30, min_lr_ratio=1.0),
        mixed_precision=policy, steps_per_loop=10, lease=factories.fast_lease())
    runner.train(save_every=30)
    losses = [r["loss"] for r in read_train_log(str(tmp_path))]
    assert np.isfinite(losses).all()
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5
    assert runner.train_step.memory.variables.states.dtype == policy.split("_")[1]
    # Evaluation (key/value memory and position keys in the compute dtype) runs too.
    assert np.isfinite(runner.evaluate("valid", max_batches=3)["loss"])


def test_tfxl_eval_counts_every_token_with_its_own_settings(copy_data, tmp_path, plain_run):
    model_dir = plain_run[2]  # a trained model_dir (config.json, checkpoints)
    files_before = {p: p.read_bytes() for p in model_dir.rglob("*") if p.is_file()}
    with open(os.path.join(copy_data, "manifest.json")) as f:
        tokens = json.load(f)["splits"]["valid"]["tokens"]
    results = {}
    for mem_len in (0, 4 * T):
        out = tmp_path / f"eval{mem_len}.json"
        result = run_in_process("tfxl.train.evaluate", f"--data_dir={copy_data}",
                                f"--model_dir={model_dir}", "--split=valid",
                                f"--tgt_len={T // 2}", f"--mem_len={mem_len}", "--same_length",
                                f"--output={out}")
        assert result.returncode == 0, result.stderr[-2000:]
        results[mem_len] = json.loads(out.read_text())
    for r in results.values():
        assert r["tokens"] == tokens and r["tgt_len"] == T // 2 and r["same_length"]
        assert r["bpc"] == pytest.approx(r["loss"] / np.log(2))
    assert results[0]["loss"] != results[4 * T]["loss"]
    bad = run_in_process("tfxl.train.evaluate", f"--data_dir={copy_data}",
                         f"--model_dir={tmp_path / 'nothing'}")
    assert bad.returncode == 2 and "does not exist" in bad.stderr
    assert {p: p.read_bytes() for p in model_dir.rglob("*") if p.is_file()} == files_before


def test_bad_files_and_values_fail_with_a_message(copy_data, tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    bad_config = tmp_path / "bad_config.json"
    bad_config.write_text('{"cutoffs": 5}')
    cases = [
        (["tfxl.train.main", *common_flags(copy_data, a_file, 5)], "is a file"),
        (["tfxl.train.main", *common_flags(copy_data, tmp_path / "m1", 5),
          f"--config={bad_config}"], "bad_config.json"),
    ]
    model_dir = tmp_path / "corrupt"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{not json")
    eval_flags = [f"--data_dir={copy_data}", f"--model_dir={model_dir}"]
    cases += [
        (["tfxl.train.evaluate", *eval_flags], "config.json is not valid JSON"),
        (["tfxl.train.evaluate", *eval_flags, f"--output={tmp_path / 'no' / 'x.json'}"],
         "does not exist"),
        (["tfxl.train.evaluate", *eval_flags, f"--output={tmp_path}"], "is a directory"),
    ]
    for args, needle in cases:
        result = run_in_process(*args)
        assert result.returncode == 2, (args, result.stderr[-1500:])
        assert needle in result.stderr and "Traceback" not in result.stderr, args
    assert a_file.read_text() == "x"  # nothing overwritten


def test_resuming_on_data_with_another_vocabulary_is_refused(copy_data, tmp_path):
    import shutil
    model_dir = tmp_path / "m"
    trained = run_in_process("tfxl.train.main", *common_flags(copy_data, model_dir, 2))
    assert trained.returncode == 0, trained.stderr[-2000:]
    other = tmp_path / "other"
    shutil.copytree(copy_data, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["vocab_sha256"] = "0" * 64
    (other / "manifest.json").write_text(json.dumps(manifest))
    result = run_in_process("tfxl.train.main", *common_flags(str(other), model_dir, 4))
    assert result.returncode == 2 and "another vocabulary" in result.stderr
    assert "Traceback" not in result.stderr


# -- the step: one gradient all-reduce, one XLA computation, static shapes ---------------------

def collective_elements(graph):
    """Elements each replica sends through collective all-reduces in `graph` (per op)."""
    return [op.inputs[0].shape.num_elements() for op in graph.get_operations()
            if op.type in ("CollectiveReduceV2", "CollectiveReduce", "NcclAllReduce")]


def test_the_gradients_cross_the_replicas_once_per_step(copy_data, tmp_path, mirrored):
    cfg = copy_task_config(copy_data, n_layer=1)
    runner = factories.language_model_run(
        cfg, strategy=mirrored, data_dir=copy_data, model_dir=str(tmp_path),
        global_batch=STREAMS, optimizer=OptimizerParams(learning_rate=3e-3, train_steps=5))
    train_step = runner.train_step
    features = next(iter(runner.data.dataset("train", STREAMS, True)))
    step = tf.function(lambda f: mirrored.run(train_step.replica_step, args=(f,)))
    graph = step.get_concrete_function(features).graph
    parameters = sum(int(np.prod(v.shape)) for v in runner.model.trainable_variables)
    reduced = collective_elements(graph)
    # Two replicas, each: the token count, the gradients once (packed), the loss.
    assert len(reduced) > 0 and sum(reduced) == 2 * (parameters + 2), (sum(reduced), parameters)


def spy_on_shapes(function, seen):
    """`function` that first records the static shapes of its tensor arguments (at trace time)."""
    def spy(*args):
        for value in tf.nest.flatten(args):
            if isinstance(value, tf.Tensor):
                seen.append(value.shape)
        return function(*args)
    return spy


@pytest.mark.large
@pytest.mark.parametrize("strategy_name", ["default", "mirrored"])
def test_every_tensor_that_reaches_a_step_has_a_static_shape(copy_data, tmp_path, mirrored,
                                                             strategy_name):
    strategy = mirrored if strategy_name == "mirrored" else tf.distribute.get_strategy()
    runner = factories.language_model_run(
        copy_task_config(copy_data, n_layer=1), strategy=strategy, data_dir=copy_data,
        model_dir=str(tmp_path), global_batch=STREAMS, optimizer=OptimizerParams(train_steps=2),
        steps_per_loop=2)
    seen = []
    train_step, evaluator = runner.train_step, runner.evaluator
    train_step._forward_backward = spy_on_shapes(train_step._forward_backward, seen)
    evaluator._forward = spy_on_shapes(evaluator._forward, seen)
    train_step.train(2)  # the real host loops, traced as the run traces them
    before = len(seen)
    evaluator.evaluate("valid", tgt_len=T // 2, mem_len=3 * T, max_batches=2)  # re-cut input
    assert before > 0 and len(seen) > before
    assert all(shape.is_fully_defined() for shape in seen), seen
    for split, training in (("train", True), ("valid", False)):
        spec = runner.data.dataset(split, STREAMS, training, tgt_len=T // 2).element_spec
        specs = tf.nest.flatten(spec, expand_composites=True)
        assert specs and all(s.shape.is_fully_defined() for s in specs), spec


@pytest.mark.large
def test_train_and_eval_steps_compile_as_one_xla_computation(copy_data, tmp_path):
    """Forward, backward, gradient all-reduce, clipping, optimizer update and memory read and
    write in one jit_compile=True function (the one-device strategy: its all-reduce is the
    identity), with the results of the step run op by op."""
    def runner_and_features(name):
        keras.utils.set_random_seed(0)
        runner = factories.language_model_run(
            copy_task_config(copy_data, dropout=0.1), data_dir=copy_data,
            model_dir=str(tmp_path / name), global_batch=STREAMS,
            optimizer=OptimizerParams(learning_rate=3e-3, train_steps=5))
        return runner, next(iter(runner.data.dataset("train", STREAMS, True)))

    plain, features = runner_and_features("plain")
    xla, _ = runner_and_features("xla")
    step = tf.function(xla.train_step.replica_step, jit_compile=True)
    hlo = step.experimental_get_compiler_ir(features)(stage="hlo")
    assert hlo.count("HloModule") == 1
    for _ in range(2):  # the second step reads the memory the first one wrote
        want = plain.train_step.replica_step(features)
        got = step(features)
        np.testing.assert_allclose([float(v) for v in got], [float(v) for v in want],
                                   rtol=1e-5)
    assert xla.train_step.step == plain.train_step.step == 2
    for a, b in zip(xla.model.trainable_variables, plain.model.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(xla.train_step.memory.gather().states.numpy(),
                               plain.train_step.memory.gather().states.numpy(), rtol=1e-4,
                               atol=1e-6)
    # The eval step: key/value ring and position keys read and written in one computation.
    evaluator = xla.evaluator
    settings = evaluator.settings()
    evaluator.eval_begin(settings)
    memory = evaluator.memories[(STREAMS, T, T)]
    keys = evaluator.position_keys[(2 * T, -1)]
    eval_features = next(iter(xla.data.dataset("valid", STREAMS, False)))
    eval_step = tf.function(lambda f: evaluator.eval_step(f, memory, keys, False),
                            jit_compile=True)
    assert eval_step.experimental_get_compiler_ir(eval_features)(
        stage="hlo").count("HloModule") == 1
    nll_sum, tokens, _, _ = eval_step(eval_features)  # and the per-position sums, unasked
    assert float(tokens) == STREAMS * T and np.isfinite(float(nll_sum))
    assert memory.read().valid.numpy().any() and int(memory.read().next_slot) == T


# -- TensorBoard ------------------------------------------------------------------------------

def scalars(log_dir):
    """{tag: {step: value}} of the scalar summaries in the event files of `log_dir`."""
    from tensorboard.backend.event_processing import event_accumulator
    events = event_accumulator.EventAccumulator(
        str(log_dir), size_guidance={event_accumulator.TENSORS: 0})
    events.Reload()
    return {tag: {e.step: float(tf.make_ndarray(e.tensor_proto)) for e in events.Tensors(tag)}
            for tag in events.Tags()["tensors"]}


def test_training_writes_tensorboard_scalars(plain_run):
    losses, _, model_dir = plain_run
    written = scalars(str(model_dir / "train"))
    assert set(written) == {"loss", "bpc", "learning_rate", "grad_norm", "tokens_per_second",
                            "steps_per_second"}
    steps = range(1, PLAIN_STEPS + 1)
    assert sorted(written["loss"]) == list(steps)
    np.testing.assert_allclose([written["loss"][s] for s in steps], losses, rtol=1e-6)
    assert written["bpc"][PLAIN_STEPS] == pytest.approx(losses[-1] / np.log(2), rel=1e-5)
    # One rate per host loop, at its last step: loops of 10 and 2 steps.
    assert sorted(written["tokens_per_second"]) == [10, PLAIN_STEPS]


def test_keras_tensorboard_callback_works_with_stateful_fit(tmp_path):
    import keras
    from tfxl import StatefulTransfoXLLM
    rng = np.random.default_rng(0)
    x = rng.integers(0, 16, (4 * 6, T)).astype(np.int32)
    y = rng.integers(0, 16, (4 * 6, T)).astype(np.int32)
    data = factories.slices((x, y)).batch(4, drop_remainder=True)
    config = factories.tiny_config(**{**COPY_TASK_MODEL, "n_layer": 1}, vocab_size=16,
                                   tgt_len=T, mem_len=T)
    model = StatefulTransfoXLLM(config, batch_size=4)
    model.compile(keras.optimizers.Adam(3e-3))
    history = model.fit(data, epochs=2, verbose=0, validation_data=data, shuffle=False,
                        callbacks=[keras.callbacks.TensorBoard(str(tmp_path), update_freq=1)])
    train, validation = scalars(tmp_path / "train"), scalars(tmp_path / "validation")
    assert set(train) >= {"epoch_loss", "batch_loss", "epoch_learning_rate"}
    assert sorted(train["epoch_loss"]) == [0, 1] and len(train["batch_loss"]) == 2 * 6
    for epoch in (0, 1):
        assert train["epoch_loss"][epoch] == pytest.approx(history.history["loss"][epoch],
                                                           rel=1e-5)
        assert validation["epoch_loss"][epoch] == pytest.approx(
            history.history["val_loss"][epoch], rel=1e-5)
