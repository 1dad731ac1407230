"""tfxl-train's plan before the first step: parameters, tokens per step and the memory estimate
(train/footprint.py), the refusal of a run that cannot fit, and --dry_run."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import factories
from tfxl.config import get_preset
from tfxl.train import footprint
from tfxl.train.footprint import parameter_count, training_footprint
from tfxl.train import plan as training_plan
from tfxl.train.optimization import OptimizerParams, make_optimizer
from tfxl.train.plan import GIB, TrainingPlan

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
    assert (footprint.classifier_parameter_count(config, 3, pooling)
            == size_of(classifier.trainable_variables))


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_state_items_are_the_sizes_of_the_trainers_tensors(policy):
    """Weights, gradients, optimizer slots and the memory state, against the tensors of a real
    model, optimizer and memory (the activations are checked against measurements:
    test_the_estimate_is_within_its_factor_of_a_measured_step)."""
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


def test_the_plan_printed_for_tiny():
    plan = TrainingPlan(get_preset("tiny", vocab_size=258), 16)
    first, second = plan.lines()
    assert first == ("plan: 124,546 parameters (2 layers, d_model 64); 1,024 tokens per step "
                     "(16 x tgt_len 64, mem_len 64); 1 replica (CPU), batch 16 per replica; "
                     "float32")
    f = plan.footprint
    assert second.startswith("memory per replica (estimate): ")
    for name in ("weights", "gradients", "optimizer (adam: 2 slots)", "memory state",
                 "activations", "attention", "feed-forward", "softmax"):
        assert name in second, name
    assert "evaluation memory" not in second and f.evaluation_memory == 0
    assert "XLA" not in second and f.xla == 0
    jit = TrainingPlan(get_preset("tiny", vocab_size=258), 16, jit_compile=True)
    assert jit.footprint.xla == footprint.XLA_BYTES + 16 * 124_546
    assert jit.lines()[1].endswith(" + XLA 257.9 MiB")
    two = TrainingPlan(get_preset("tiny", vocab_size=258), 16, replicas=2, local_replicas=2,
                       eval_settings={"tgt_len": 32, "mem_len": 128})
    assert "2 replicas (CPU), batch 8 per replica" in two.lines()[0]
    assert "evaluation memory" in two.lines()[1] and two.footprint.evaluation_memory > 0
    with pytest.raises(ValueError, match="--train_batch_size=16 is not divisible by the 3 "
                                         "replicas"):
        TrainingPlan(get_preset("tiny", vocab_size=258), 16, replicas=3)


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
    parts = f.weights + f.gradients + f.optimizer
    assert split.device_bytes == f.total - parts + -(-parts // 4)
    limit = (split.device_bytes + whole.device_bytes) // 2  # fits split, not whole
    assert "per device (a replica's weights split over 4)" in split.check_memory(limit=limit)
    with pytest.raises(ValueError, match="per replica, exceeds"):
        whole.check_memory(limit=limit)


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

    anyway = run_cli(*flags, "--memory_limit_gib=0.01", "--ignore_memory_estimate")
    assert anyway.returncode == 0, anyway.stderr[-2000:]
    assert "warning: the estimated memory" in anyway.stdout
    assert json.loads((tmp_path / "m" / "metrics.json").read_text())["step"] == 2


@pytest.mark.large
@pytest.mark.subprocess
@pytest.mark.parametrize("name,policy,jit", [("bench", "float32", False),
                                             ("bench", "mixed_bfloat16", True)])
def test_the_estimate_is_within_its_factor_of_a_measured_step(name, policy, jit):
    """Peak RSS of real training steps (benchmarks/memory_bench.py, a fresh process) against the
    plan's estimate for the whole process (runtime + one replica). BENCHMARKS.md has more."""
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.memory_bench", "--child", f"--configs={name}",
         f"--dtypes={policy}", "--batch=16", "--mem_lens=128", f"--jit={'on' if jit else 'off'}",
         "--steps=1"], cwd=REPO, capture_output=True, text=True, env=ENV, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    measured = json.loads(result.stdout.split("RESULT ", 1)[1])
    assert measured["est_parameters"] == measured["n_params"]
    # Under the whole suite (two xdist workers) the same step peaked at 0.59-0.69 of the estimate,
    # alone at 0.86-1.13: the refusal must not be late (the upper bound); an estimate that
    # overshoots by up to 2x is a loose plan, not a wrong one.
    assert 0.5 <= measured["ratio"] <= footprint.STATED_FACTOR, measured


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
