"""On JAX tfxl-train compiles its first host loop before it runs it and checks the plan again
with XLA's own figure for it (`memory_analysis()`), before anything is written; the first loop
is one step (each loop length is a program of its own), then loops of --steps_per_loop.

Runs in the JAX pass; the TensorFlow and PyTorch passes skip it.
"""

import json

import keras
import numpy as np
import pytest

import factories
from factories import assert_one_error_line, run_in_process

pytestmark = [pytest.mark.every_backend,
              pytest.mark.skipif(keras.backend.backend() != "jax",
                                 reason="JAX's ahead-of-time compile: runs in the JAX pass")]

T = 8
STREAMS = 4
TOOL = "tfxl.train.main"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return factories.random_bytes_data(tmp_path_factory.mktemp("compiled_plan"), T, STREAMS)


def cli_flags(data_dir, model_dir, steps=12, *extra):
    return [f"--data_dir={data_dir}", f"--model_dir={model_dir}", "--n_layer=1", "--d_model=16",
            "--n_head=2", "--d_head=8", "--d_inner=32", f"--tgt_len={T}", f"--mem_len={T}",
            f"--train_batch_size={STREAMS}", f"--train_steps={steps}", "--steps_per_loop=5",
            "--save_every=10", "--train_log_seconds=0", "--lease_settle=0",
            "--strategy=data_parallel", *extra]


def logged_steps(model_dir):
    return [json.loads(line)["step"] for path in sorted((model_dir / "train_log").iterdir())
            for line in path.read_text().splitlines()]


def test_the_plan_is_checked_again_with_xlas_figure_before_the_first_step(data_dir, tmp_path):
    done = run_in_process(TOOL, *cli_flags(data_dir, tmp_path / "m"))
    assert done.returncode == 0, done.stderr[-3000:]
    out, err = done.stdout.splitlines(), done.stderr.splitlines()
    compiled = [line for line in out if line.startswith(
        "memory per replica (estimate: XLA's memory_analysis of the compiled step): ")]
    assert len(compiled) == 1 and " compiled step " in compiled[0], done.stdout
    # The compiled figure's memory line comes after the estimate's and before the first step.
    memory = [i for i, line in enumerate(out) if line.startswith("memory: ")]
    first_step = next(i for i, line in enumerate(out) if line.startswith("step "))
    assert len(memory) == 2 and memory[1] == out.index(compiled[0]) + 1 < first_step, out
    assert err.index("step 0: compiling the train step (a host loop of 1 step)") \
        < next(i for i, line in enumerate(err) if line.startswith("compiled in ")) \
        < err.index("step 0: running the first host loop (1 step)"), err
    # One step first, then loops of --steps_per_loop, cut for the checkpoint at 10.
    assert logged_steps(tmp_path / "m") == list(range(1, 13)), logged_steps(tmp_path / "m")
    assert [line.split(":")[0] for line in out if line.startswith("step ")] == [
        "step 1/12", "step 6/12", "step 10/12", "step 12/12"], out


def test_without_short_first_loops_the_loops_are_steps_per_loop_long(data_dir, tmp_path):
    done = run_in_process(TOOL, *cli_flags(data_dir, tmp_path / "m", 12,
                                           "--noshort_first_loops"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert [line.split(":")[0] for line in done.stdout.splitlines()
            if line.startswith("step ")] == ["step 5/12", "step 10/12", "step 12/12"]
    assert "step 0: compiling the train step (a host loop of 5 steps)" in done.stderr


def test_a_compiled_step_over_the_limit_is_refused_before_anything_is_written(
        data_dir, tmp_path, monkeypatch):
    """XLA's figure decides: the estimate fits, the compiled loop (made to report 1 TiB) does
    not; one error line, exit 2, and the model_dir has nothing in it."""
    from tfxl import sizing
    monkeypatch.setattr(sizing, "compiled_bytes", lambda analysis: 2**40)
    model_dir = tmp_path / "m"
    refused = run_in_process(TOOL, *cli_flags(data_dir, model_dir, 12, "--memory_limit_gib=64"))
    assert_one_error_line(refused, "the estimated memory", "exceeds its 64.0 GiB",
                          "--ignore_memory_estimate")
    assert "memory per replica (estimate: XLA's memory_analysis" in refused.stdout
    assert not model_dir.exists() or not any(model_dir.iterdir()), list(model_dir.iterdir())
    anyway = run_in_process(TOOL, *cli_flags(data_dir, model_dir, 2, "--memory_limit_gib=64",
                                             "--ignore_memory_estimate"))
    assert anyway.returncode == 0, anyway.stderr[-3000:]
    assert "training anyway (--ignore_memory_estimate)" in anyway.stdout


def test_a_dry_run_compiles_nothing(data_dir, tmp_path):
    done = run_in_process(TOOL, *cli_flags(data_dir, tmp_path / "m", 12, "--dry_run"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "compiling" not in done.stderr and "memory_analysis" not in done.stdout


def test_the_loop_compiled_ahead_is_the_one_that_runs_on_the_batches_it_read(
        data_dir, tmp_path, monkeypatch):
    """compile_loop traces the loop once and the call that follows reuses it, on the batches
    compile_loop read: the losses equal those of a step that was not compiled ahead."""
    from tfxl.tpu.jax_mesh import resolve_distribution
    from tfxl.train.loop.jax_train_step import JaxTrainStep
    from tfxl.train.loop.optimization import OptimizerParams
    traced = []
    loop_fn = JaxTrainStep._loop_fn
    monkeypatch.setattr(JaxTrainStep, "_loop_fn",
                        lambda self, *args: traced.append(1) or loop_fn(self, *args))
    config = factories.tiny_config(vocab_size=factories.vocab_size_of(data_dir), n_layer=1,
                                   d_model=16, n_head=2, d_head=8, d_inner=32, tgt_len=T,
                                   mem_len=T)
    losses = []
    for ahead in (True, False):
        run = factories.language_model_run(
            config, data_dir=data_dir, model_dir=str(tmp_path / str(ahead)),
            global_batch=STREAMS, optimizer=OptimizerParams(learning_rate=3e-3, train_steps=4),
            strategy=resolve_distribution("data_parallel"))
        step, traced[:] = run.train_step, []
        if ahead:
            peak = step.compile_loop(3)
            assert peak > 0 and traced == [1]
        losses.append(step.train(3)["loss"])
        assert traced == [1]  # compiled once: ahead, or by the call
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-6)
