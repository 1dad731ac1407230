"""tfxl-train's plan before the first step: parameters, tokens per step and the memory estimate
(tfxl/sizing.py), the refusal of a run that cannot fit, and --dry_run."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import factories
from tfxl.config import get_preset
from tfxl import sizing
from tfxl.sizing import parameter_count, training_footprint
from tfxl.train.planning import plan as training_plan
from tfxl.train.loop.optimization import OptimizerParams, make_optimizer
from tfxl.train.planning.plan import GIB, TrainingPlan

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


def size_of(variables):
    return sum(int(np.prod(v.shape)) for v in variables)


@pytest.mark.parametrize("config", [
    factories.tiny_config(),
    factories.tiny_config(d_embed=8, untie_r=True),  # one table, projected
    factories.tiny_config(cutoffs=(5, 12), tie_weight=False),
    factories.adaptive_config(),  # div_val 2, projected tails, tied projections
    factories.adaptive_config(tie_weight=False, tie_projs=(True, False, True)),
    factories.adaptive_config(proj_same_dim=False, d_embed=16, d_model=16),
], ids=["tiny", "projected", "untied_cutoffs", "adaptive", "untied_adaptive", "same_dim"])
def test_parameter_count_is_the_models(config):
    model = factories.TransfoXLLM(config)
    model.build((None, config.tgt_len))
    assert parameter_count(config) == size_of(model.trainable_variables)


@pytest.mark.parametrize("pooling", ["last", "segment_attention"])
def test_classifier_parameter_count_is_the_classifiers(pooling):
    """tfxl-classify-train's plan counts the backbone and the head, not the language model's
    softmax."""
    from tfxl.classification import DocumentClassifier
    config = factories.adaptive_config()
    classifier = DocumentClassifier(config, 3, pooling=pooling)
    assert (sizing.classifier_parameter_count(config, 3, pooling)
            == size_of(classifier.trainable_variables))


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_state_items_are_the_sizes_of_the_trainers_tensors(policy):
    """Weights, gradients, optimizer slots and the memory state, against the tensors of a real
    model, optimizer and memory (the activations and the step's program are checked against
    measurements: test_a_measured_step_peaks_within_the_estimate)."""
    keras.config.set_dtype_policy(policy)
    config, batch = factories.tiny_config(mem_len=7), 3
    model = factories.TransfoXLLM(config)
    model.build((None, config.tgt_len))
    optimizer, _ = make_optimizer(OptimizerParams(), policy)
    optimizer.build(model.trainable_variables)
    estimate = training_footprint(config, batch, policy, "adam")
    weights = 4 * size_of(model.trainable_variables)
    assert estimate.weights == weights * (1 if policy == "float32" else 1.5)
    assert estimate.gradients == weights
    slots = [v for v in optimizer.variables if v.shape.rank and v.dtype == "float32"]
    assert estimate.optimizer == 4 * size_of(slots) == 2 * weights
    states = model.init_memory(batch).states
    assert estimate.memory_state == 2 * states.numpy().nbytes  # the variable and the new one
    # TensorFlow's clipped gradients beside the gradients; JAX's step updates in place.
    assert estimate.gradient_copies == weights
    assert training_footprint(config, batch, policy, backend="jax").gradient_copies == 0


def test_the_plans_numbers_for_tiny():
    plan = TrainingPlan(get_preset("tiny", vocab_size=258), 16)
    f = plan.footprint
    assert (f.parameters, plan.tokens_per_step, plan.per_replica_batch) == (124_546, 1024, 16)
    assert plan.lines()[0].startswith("plan: 124,546 parameters (2 layers, d_model 64); 1,024 "
                                      "tokens per step")
    names = [name for name, _ in f.items()]
    assert names == ["weights", "gradients", "optimizer", "gradient copies", "memory state",
                     "activations", "TensorFlow graph", "margin"]
    assert f.total == sum(value for _, value in f.items())
    assert f.margin == int(sizing.MARGIN * (f.total - f.margin))
    costs = sizing.STEP_COSTS["tensorflow", False]
    assert f.program == costs.program + 2 * costs.per_layer
    assert f.evaluation_memory == 0
    second = plan.lines()[1]
    assert second.startswith(f"memory per replica (estimate): {training_plan._size(f.total)} = ")
    for name in ("optimizer (adam: 2 slots)", "attention", "feed-forward", "softmax"):
        assert name in second, name

    jit = TrainingPlan(get_preset("tiny", vocab_size=258), 16, jit_compile=True)
    xla = sizing.STEP_COSTS["tensorflow", True]
    assert (jit.footprint.program_name, jit.footprint.program) == (
        "XLA", xla.program + 2 * xla.per_layer)
    on_jax = TrainingPlan(get_preset("tiny", vocab_size=258), 16, backend="jax")
    assert on_jax.footprint.program_name == "XLA" and on_jax.footprint.gradient_copies == 0

    two = TrainingPlan(get_preset("tiny", vocab_size=258), 16, replicas=2, local_replicas=2,
                       eval_settings={"tgt_len": 32, "mem_len": 128})
    assert two.per_replica_batch == 8 and two.replicas == 2
    assert two.footprint.evaluation_memory == sizing.evaluation_memory_bytes(
        two.config, 8, 32, 128)
    assert "evaluation memory" in dict(two.footprint.items())
    with pytest.raises(ValueError, match="--train_batch_size=16 is not divisible by the 3 "
                                         "replicas"):
        TrainingPlan(get_preset("tiny", vocab_size=258), 16, replicas=3)


def test_off_tensorflow_the_checkpoints_mirrors_of_the_weights_and_slots_are_counted():
    """On JAX a checkpoint is written from float32 TensorFlow mirrors of every weight and
    optimizer slot, kept once the first save made them: the host figure counts them, names
    them, and a refusal they dominate names the model's size flags."""
    config = get_preset("tiny", vocab_size=258, d_model=2048, d_inner=8192)
    tf_plan, jax_plan = (TrainingPlan(config, 4, backend=name) for name in ("tensorflow", "jax"))
    p = jax_plan.footprint.parameters
    assert tf_plan.checkpoint_mirror_bytes == 0
    assert jax_plan.checkpoint_mirror_bytes == 4 * p * 3  # weights, adam's 2 slots
    assert jax_plan.host_bytes(0) - jax_plan.checkpoint_mirror_bytes == (
        jax_plan.footprint.total + jax_plan.checkpoint_memory_bytes + sizing.RUN_BYTES)
    line = jax_plan.check_memory(limit=64 * GIB, runtime=GIB // 2)
    assert f"{training_plan._size(12 * p + jax_plan.checkpoint_memory_bytes)} checkpoint copy " \
           "of the weights, optimizer and memory" in line, line
    assert "checkpoint copy of the memory" in tf_plan.check_memory(limit=64 * GIB,
                                                                   runtime=GIB // 2)
    with pytest.raises(ValueError, match=r"the weights, gradients and optimizer slots .* "
                                         r"lower the model's size: .*--d_model \(2048\)"):
        jax_plan.check_memory(limit=jax_plan.host_bytes(GIB // 2) - 1, runtime=GIB // 2)


def test_a_compiled_steps_analysis_replaces_the_counted_items():
    """JAX's memory_analysis of the compiled step, where one is at hand, is the plan's figure for
    the step: the state, gradients and activations are in it; the program and the margin are not."""
    plan = TrainingPlan(get_preset("tiny", vocab_size=258), 16, backend="jax")
    counted = plan.footprint
    plan.with_compiled(100 * 2**20)
    f = plan.footprint
    assert f.compiled == int(sizing.COMPILED_FACTOR * 100 * 2**20)
    assert [name for name, _ in f.items()] == ["compiled step", "XLA", "margin"]
    assert f.margin == int(sizing.MARGIN * (f.compiled + counted.program))
    assert f.total == f.compiled + counted.program + f.margin
    assert plan.lines()[1].startswith("memory per replica (estimate: XLA's memory_analysis of the "
                                     "compiled step): ")
    assert plan.device_bytes == f.total

    class Analysis:  # the fields of jax's CompiledMemoryStats that compiled_bytes reads
        argument_size_in_bytes, output_size_in_bytes = 300, 280
        alias_size_in_bytes, temp_size_in_bytes = 250, 70
    assert sizing.compiled_bytes(Analysis) == 300 + 280 - 250 + 70


def readme_plan(**changes):
    """The README's enwik8_base command on one CPU replica."""
    return TrainingPlan(get_preset("enwik8_base", vocab_size=204), **{**dict(
        global_batch=24, mixed_precision="mixed_bfloat16"), **changes})


def test_a_run_over_the_limit_is_refused_with_what_to_lower():
    plan = readme_plan()
    with pytest.raises(ValueError) as raised:
        plan.check_memory(limit=12 * GIB, runtime=GIB // 2)
    message = str(raised.value)
    assert message.startswith("the estimated memory, ")
    for needle in ("on this host (runtime 512.0 MiB + 1 x ", " per replica + ",
                   "exceeds its 12.0 GiB", "lower --train_batch_size (24), --tgt_len (512) or "
                   "--mem_len (512)", "or pass --ignore_memory_estimate to train anyway"):
        assert needle in message, message
    warning = plan.check_memory(limit=12 * GIB, ignore=True, runtime=GIB // 2)
    assert warning.startswith("warning: the estimated memory") and warning.endswith(
        "training anyway (--ignore_memory_estimate)")
    fits = readme_plan(global_batch=4).check_memory(limit=24 * GIB, runtime=GIB // 2)
    assert fits.startswith("memory: ") and fits.endswith("of 24.0 GiB")


def test_a_refusal_names_the_flags_of_what_dominates_the_estimate():
    """Weights no batch makes fit: the model's size flags only; weights the most of it: those
    first, then the batch's; activations the most of it: the batch, tgt_len and mem_len."""
    wide = TrainingPlan(get_preset("tiny", vocab_size=258, d_model=10**6, tgt_len=128), 8)
    with pytest.raises(ValueError) as raised:
        wide.check_memory(limit=16 * GIB, runtime=GIB // 2)
    message = str(raised.value)
    for needle in ("the weights, gradients and optimizer slots (1,932,000,898 parameters) take",
                   "more than fits at any batch", "--d_model (1000000)", "--n_layer (2)",
                   "--d_inner (256)"):
        assert needle in message, message
    assert "--train_batch_size" not in message and "--mem_len" not in message, message

    heavy = TrainingPlan(get_preset("tiny", vocab_size=258, d_model=4096, n_layer=4,
                                    d_inner=16384, tgt_len=16, mem_len=16), 2)
    model, run = heavy.lowerable_bytes()
    assert model > run
    need = heavy.host_bytes(GIB // 2)
    with pytest.raises(ValueError) as raised:  # the model fits, its activations at this batch not
        heavy.check_memory(limit=need - run // 2, runtime=GIB // 2)
    message = str(raised.value)
    assert "the most of it: lower the model's size: --d_model (4096)" in message, message
    assert "--d_inner (16384)" in message and "or lower --train_batch_size (2)" in message
    assert "more than fits at any batch" not in message

    vocabulary = TrainingPlan(get_preset("tiny", vocab_size=2_000_000, d_model=1024), 2)
    with pytest.raises(ValueError, match=r"--d_model \(1024\) \(the 2,000,000-token "
                                         r"vocabulary's tables .* --cutoffs"):
        vocabulary.check_memory(limit=16 * GIB, runtime=GIB // 2)

    with pytest.raises(ValueError) as raised:
        readme_plan().check_memory(limit=12 * GIB, runtime=GIB // 2)
    assert "--d_model" not in str(raised.value) and "--train_batch_size (24)" in str(raised.value)


def test_gpus_are_checked_per_replica_and_unknown_memory_is_not_checked():
    reported = [12 * GIB]  # what the backend's device_memory_bytes says
    plan = readme_plan(replicas=8, global_batch=24 * 8, local_replicas=8, device="GPU",
                       device_memory=lambda: reported[0])
    with pytest.raises(ValueError, match=r"per replica, exceeds the 12.0 GiB of each GPU"):
        plan.check_memory()
    assert plan.check_memory(limit=80 * GIB).endswith("of the 80.0 GiB of each GPU")
    reported[0] = None
    assert plan.check_memory().startswith("memory: not checked (GPU memory is not reported")
    assert readme_plan(device="TPU").check_memory().startswith("memory: not checked (TPU")


def test_model_parallel_checks_each_device_with_its_part_of_the_weights():
    whole = readme_plan(device="GPU")
    split = readme_plan(device="GPU", model_axis=4)
    f = whole.footprint
    parts = f.weights + f.gradients + f.optimizer + f.gradient_copies
    assert split.device_bytes == f.total - parts + -(-parts // 4)
    limit = (split.device_bytes + whole.device_bytes) // 2  # fits split, not whole
    assert "per device (a replica's weights split over 4)" in split.check_memory(limit=limit)
    with pytest.raises(ValueError, match="per replica, exceeds"):
        whole.check_memory(limit=limit)


def test_the_runtime_resident_is_the_processs_own_not_its_parents():
    """A process started by a large one (this test runner) counts only its own pages: Linux's
    ru_maxrss would start at the parent's size."""
    from tfxl.host import resident_bytes
    parent = resident_bytes()
    child = subprocess.run([sys.executable, "-c", "import resource; from tfxl.host import "
                            "resident_bytes; print(resident_bytes(), resource.getrusage("
                            "resource.RUSAGE_SELF).ru_maxrss * 1024)"],
                           capture_output=True, text=True, timeout=120, check=True)
    own, inherited = map(int, child.stdout.split())
    assert min(parent, inherited) > 4 * own, (parent, own, inherited)


def test_host_memory_is_the_smaller_of_ram_and_the_cgroup_limit():
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 0 < training_plan.host_memory_bytes() <= ram


# -- the command line -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return factories.random_bytes_data(tmp_path_factory.mktemp("plan"), 64, 4, train_bytes=8000)


def run_cli(*args):
    return factories.run_in_process("tfxl.train.main", *args)


def test_cli_dry_run_prints_the_plan_and_writes_nothing(data_dir, tmp_path):
    flags = [f"--data_dir={data_dir}", f"--model_dir={tmp_path / 'm'}", "--train_batch_size=4",
             "--train_steps=2", "--lease_settle=0"]
    dry = run_cli(*flags, "--dry_run")
    assert dry.returncode == 0, dry.stderr[-2000:]
    lines = dry.stdout.splitlines()
    assert lines[0].startswith("plan: 124,546 parameters (2 layers, d_model 64); 256 tokens per "
                               "step (4 x tgt_len 64, mem_len 64); 1 replica (CPU), batch 4 per "
                               "replica; float32"), dry.stdout
    assert lines[1].startswith("memory per replica (estimate): ")
    assert lines[2].startswith("memory: ") and "on this host (runtime " in lines[2]
    assert lines[3] == "dry run: nothing written"
    assert not (tmp_path / "m").exists()

    error = factories.assert_one_error_line(
        run_cli(*flags, "--memory_limit_gib=0.01"), "exceeds its 10.2 MiB; lower "
        "--train_batch_size (4), --tgt_len (64) or --mem_len (64)")
    assert error.startswith("error: the estimated memory, "), error
    assert not (tmp_path / "m").exists()

    wide = factories.assert_one_error_line(run_cli(*flags, "--d_model=1000000"),
                                           "more than fits at any batch")
    assert "--d_model (1000000)" in wide and "--train_batch_size" not in wide, wide
    assert not (tmp_path / "m").exists()

    anyway = run_cli(*flags, "--memory_limit_gib=0.01", "--ignore_memory_estimate")
    assert anyway.returncode == 0, anyway.stderr[-2000:]
    assert "warning: the estimated memory" in anyway.stdout
    assert json.loads((tmp_path / "m" / "metrics.json").read_text())["step"] == 2


def measured_step(name, backend, policy, jit, batch, mem_len):
    """Peak RSS of real training steps in a fresh process (benchmarks/memory_bench.py) and the
    plan's estimate for the whole process: the idle process's RSS (TensorFlow, and JAX on JAX,
    imported: what the plan measures as the runtime) + one replica's footprint."""
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.memory_bench", "--child", f"--configs={name}",
         f"--dtypes={policy}", f"--batch={batch}", f"--mem_lens={mem_len}",
         f"--jit={'on' if jit else 'off'}", "--steps=2"], cwd=REPO, capture_output=True,
        text=True, env={**ENV, "KERAS_BACKEND": backend, "JAX_PLATFORMS": "cpu"}, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    measured = json.loads(result.stdout.split("RESULT ", 1)[1])
    assert measured["est_parameters"] == measured["n_params"]
    return measured


# Ruled by the width of the layers, by their number, by the parameters; both backends, both
# policies, XLA on and off (benchmarks/memory_bench.py's SHAPES; BENCHMARKS.md has the grid).
@pytest.mark.large
@pytest.mark.subprocess
@pytest.mark.memory_peak
@pytest.mark.parametrize("name,backend,policy,jit,batch,mem_len", [
    ("deep", "tensorflow", "float32", False, 4, 32),
    ("wide", "tensorflow", "mixed_bfloat16", True, 4, 64),
    ("deep", "jax", "float32", True, 8, 64),
    ("heavy", "jax", "mixed_bfloat16", True, 4, 32),
])
def test_a_measured_step_peaks_within_the_estimate(name, backend, policy, jit, batch, mem_len):
    """The plan's figure is never below the measured peak (the refusal is never late) and not
    more than 1 / LOWEST_RATIO above it; on JAX the figure from memory_analysis too."""
    measured = measured_step(name, backend, policy, jit, batch, mem_len)
    shown = json.dumps(measured)  # every field: pytest would cut the dict short
    assert sizing.LOWEST_RATIO <= measured["ratio"] <= 1, shown
    if backend == "jax":
        compiled = measured["peak_mib"] / measured["compiled_estimate_mib"]
        assert sizing.LOWEST_RATIO <= compiled <= 1, shown


@pytest.mark.large
@pytest.mark.subprocess
@pytest.mark.memory_peak
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_tfxl_trains_own_peak_is_within_its_plan_checkpoint_included(backend, tmp_path):
    """tfxl-train itself, a wide model (2 layers of D 2048, F 8192: its weights and optimizer
    slots rule), 2 steps and the checkpoint at the end: the process's own peak (VmHWM, read at
    exit) within [LOWEST_RATIO, 1] of the plan's "on this host" figure, and on JAX of the one
    from XLA's memory_analysis too."""
    import re
    data_dir = factories.random_bytes_data(tmp_path, 32, 4)
    measure = ("import atexit, runpy, sys\n"
               "from tfxl.host import resident_bytes\n"
               "atexit.register(lambda: print(f'PEAK {resident_bytes()}', file=sys.stderr))\n"
               "sys.argv = ['tfxl-train'] + sys.argv[1:]\n"
               "runpy.run_module('tfxl.train.main', run_name='__main__')\n")
    done = subprocess.run(
        [sys.executable, "-c", measure, f"--data_dir={data_dir}", f"--model_dir={tmp_path}/m",
         "--n_layer=2", "--d_model=2048", "--n_head=8", "--d_head=64", "--d_inner=8192",
         "--tgt_len=32", "--mem_len=64", "--train_batch_size=4", "--train_steps=2",
         "--steps_per_loop=2", "--lease_settle=0"], cwd=REPO, capture_output=True, text=True,
        env={**ENV, "KERAS_BACKEND": backend, "JAX_PLATFORMS": "cpu"}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    peak = int(re.search(r"^PEAK (\d+)$", done.stderr, re.M).group(1))
    size = r"([\d.]+) ([KMG]iB)"
    plans = []  # each "on this host" figure, summed from its parts (MiB to 0.1, GiB to 0.05)
    for parts in re.findall(rf"on this host \(runtime {size} \+ 1 x {size} per replica \+ "
                            rf"{size} checkpoint copy of [^+]* \+ {size} of the run\)",
                            done.stdout):
        plans.append(sum(float(value) * 2 ** {"KiB": 10, "MiB": 20, "GiB": 30}[unit]
                         for value, unit in zip(parts[::2], parts[1::2])))
    assert len(plans) == (2 if backend == "jax" else 1), done.stdout
    ratios = [peak / plan for plan in plans]
    assert all(sizing.LOWEST_RATIO <= ratio <= 1 for ratio in ratios), (ratios, done.stdout)


def test_a_memory_no_host_holds_is_refused_on_a_tpu_too():
    """TPU memory is not reported, but the checkpoint is saved from a host copy of the training
    memory [B, L, M, D]: tfxl-train --mem_len=1000000000 is refused there, not an OOM."""
    plan = TrainingPlan(get_preset("enwik8_base", vocab_size=204, mem_len=10**9),
                        global_batch=24, device="TPU")
    with pytest.raises(ValueError, match=r"^the checkpoint copy of the training memory, .* on "
                                         r"this host .* exceeds its .*--mem_len \(1000000000\)"):
        plan.check_memory(runtime=GIB // 2)


def test_an_evaluation_is_checked_as_training_is(monkeypatch):
    """tfxl-eval's check (plan.check_evaluation_memory): the host's memory on CPU, naming the
    batch and each setting with its source; a device whose memory is not reported: not checked."""
    import tensorflow as tf
    check = training_plan.check_evaluation_memory
    config, strategy = get_preset("enwik8_base", vocab_size=204), tf.distribute.get_strategy()
    settings = dict(tgt_len=80, mem_len=2100, clamp_len=-1, same_length=True)
    sources = {key: f"flag --{key}" for key in settings}
    check(config, strategy, 16, settings, sources, limit=64 * GIB)
    with pytest.raises(ValueError, match=r"^the estimated memory of this evaluation, .* exceeds "
                                         r"this host's 1.0 GiB .* lower --eval_batch_size \(16\), "
                                         r"--tgt_len \(80, flag --tgt_len\) or --mem_len "
                                         r"\(2100, flag --mem_len\)"):
        check(config, strategy, 16, settings, sources, limit=GIB)
    from tfxl.train.backends.tensorflow import TensorFlowBackend
    monkeypatch.setattr(TensorFlowBackend, "device_kind", "GPU")
    monkeypatch.setattr(TensorFlowBackend, "device_memory_bytes", lambda self: None)
    check(config, strategy, 16, {**settings, "mem_len": 10**12}, sources)
