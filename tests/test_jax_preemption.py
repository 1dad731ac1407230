"""tfxl-train on JAX as a process: SIGTERM stops it at the end of a host loop with the checkpoint
of that step, kill -9 in a save loses only the steps since the checkpoint before, and either way
the rerun of the same command continues step for step as if the run had never stopped; the same
with every path on gs://, where the TensorFlow tools (tfxl-eval, tfxl-export) read the JAX
run's model_dir; and the mistakes only a JAX run can make, each refused in one line.

Every run here is data parallel over four simulated CPU devices. The runs no signal reaches go
through one JAX process (`jax_worker`: factories.GcsWorker's loop, on JAX) so that JAX and
TensorFlow load once; the ones a test signals or kills are processes of their own.
"""

import json
import os
import signal
import subprocess
import sys

import pytest
import tensorflow as tf

import factories
from factories import STARTED, no_process_left_behind  # noqa: F401 (autouse)
from backends import JAX_XLA_FLAGS
from tfxl.model_dir import ModelDir
from tfxl.train.records.train_log import read_train_log

T = 8          # segment length of the test data
STREAMS = 8    # streams per split (the global batch)
STEPS = 12     # steps of every run here: host loops of 2 after one of 1, a checkpoint every 4
STOP_AT = 4    # the signal comes in the host loop that starts here: the run stops at STOP_AT + 2

JAX_ENV = {"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"{JAX_XLA_FLAGS} --xla_force_host_platform_device_count=4"}


def cli_flags(data_dir, model_dir):
    return [f"--data_dir={data_dir}", f"--model_dir={model_dir}", "--strategy=data_parallel",
            "--n_layer=1", "--d_model=16", "--n_head=2", "--d_head=8", "--d_inner=32",
            "--dropout=0.1", f"--tgt_len={T}", f"--mem_len={T}",
            f"--train_batch_size={STREAMS}", f"--train_steps={STEPS}", "--steps_per_loop=2",
            "--save_every=4", "--learning_rate=0.003", "--train_log_seconds=0",
            "--lease_settle=0"]


class OnJax:
    """What factories.GcsWorker asks of its `gcs` (`popen`), for a worker on JAX: inside the
    emulator's namespace when given the `gcs` fixture's emulator, else a plain process."""

    def __init__(self, gcs=None):
        self._gcs = gcs

    def popen(self, argv, *, env=None, **kwargs):
        env = {**JAX_ENV, **(env or {})}
        if self._gcs is not None:
            return self._gcs.popen(argv, env=env, **kwargs)
        kwargs = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, **kwargs}
        return subprocess.Popen(argv, env={**os.environ, **env}, **kwargs)




def start(argv, gcs=None, **kwargs):
    """A tfxl-train process on JAX (in the emulator's namespace with `gcs`) that a test signals
    or kills."""
    proc = OnJax(gcs).popen([sys.executable, *argv], **kwargs)
    STARTED.append(proc)
    return proc


@pytest.fixture(scope="module")
def jax_worker():
    """One JAX process that runs tools through their `run()` (factories.GcsWorker's `tool`)."""
    with factories.GcsWorker(OnJax()) as worker:
        yield worker


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return factories.random_bytes_data(tmp_path_factory.mktemp("jax_preemption"), T, STREAMS)


@pytest.fixture(scope="module")
def reference(data_dir, jax_worker, tmp_path_factory):
    """The uninterrupted run's model_dir."""
    model_dir = tmp_path_factory.mktemp("reference") / "m"
    done = jax_worker.tool("tfxl.train.main", *cli_flags(data_dir, model_dir), cwd=model_dir.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return model_dir


def logged_losses(records):
    return {r["step"]: r["loss"] for r in records}


def assert_continues_exactly(records, reference):
    """Every step logged once, each loss the uninterrupted run's."""
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    losses, expected = logged_losses(records), logged_losses(read_train_log(str(reference)))
    for step in range(1, STEPS + 1):
        assert losses[step] == pytest.approx(expected[step], rel=1e-6, abs=0), step


# tfxl-train, whose host loop from step `at` starts only once a signal was noted (the signal
# comes inside that host loop as the controller sees it, whatever the machine's speed; the run
# stops at the loop's end): `python -c STOPPED_IN_THE_HOST_LOOP at marker <tfxl-train flags>`.
STOPPED_IN_THE_HOST_LOOP = """
import sys, threading
at, marker, sys.argv = int(sys.argv[1]), sys.argv[2], ["tfxl-train"] + sys.argv[3:]
from tfxl.train.loop import jax_train_step
from tfxl.train.records import preemption
noted = threading.Event()
received = preemption.StopOnSignals._received

def note(self, signum):
    received(self, signum)
    noted.set()

train = jax_train_step.JaxTrainStep.train

def train_once_signalled(self, num_steps):
    if self.step == at:
        open(marker, "w").close()
        assert noted.wait(300), "no signal came"
    return train(self, num_steps)

preemption.StopOnSignals._received = note
jax_train_step.JaxTrainStep.train = train_once_signalled
from tfxl.train.main import run
run()
"""


def stop_with_sigterm(proc, marker):
    """SIGTERM to `proc` once it is in the host loop from STOP_AT; its (code, stdout, stderr)."""
    if not factories.wait_for_marker(proc, marker):
        proc.kill()
        raise AssertionError(f"the host loop from step {STOP_AT} never started: "
                             f"{proc.communicate(timeout=60)[1][-3000:]}")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


def assert_stopped_with_a_checkpoint(code, out, err, model_dir):
    """The run stopped by SIGTERM in the host loop from STOP_AT saved at its end and said so;
    returns the checkpoint's path."""
    stopped_at = STOP_AT + 2
    checkpoint = f"{model_dir}/checkpoints/ckpt-{stopped_at}"
    assert code == 143, (code, out[-2000:], err[-3000:])
    assert "Traceback" not in err, err[-3000:]
    assert [line for line in out.splitlines() if "stopped by" in line] == [
        f"stopped by SIGTERM at step {stopped_at}: checkpoint saved in {checkpoint}; run the "
        "same command to resume"], out[-2000:]
    return checkpoint


@pytest.mark.large
@pytest.mark.subprocess
def test_sigterm_saves_at_the_end_of_the_host_loop_and_the_rerun_continues_exactly(
        data_dir, tmp_path, jax_worker, reference):
    model_dir, marker = tmp_path / "m", tmp_path / "in_the_host_loop"
    flags = cli_flags(data_dir, model_dir)
    proc = start(["-c", STOPPED_IN_THE_HOST_LOOP, str(STOP_AT), str(marker), *flags])
    checkpoint = assert_stopped_with_a_checkpoint(*stop_with_sigterm(proc, marker), model_dir)
    assert tf.train.latest_checkpoint(str(model_dir / "checkpoints")) == checkpoint
    assert max(logged_losses(read_train_log(str(model_dir)))) == STOP_AT + 2
    assert not (model_dir / "metrics.json").exists()  # the run did not finish

    done = jax_worker.tool("tfxl.train.main", *flags, cwd=tmp_path)  # the same command
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resumed from {checkpoint} at step {STOP_AT + 2}" in done.stderr, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1].startswith(f"done: step {STEPS}")
    assert json.loads((model_dir / "metrics.json").read_text())["start_step"] == STOP_AT + 2
    assert_continues_exactly(read_train_log(str(model_dir)), reference)


@pytest.mark.large
@pytest.mark.subprocess
def test_kill_9_in_a_save_resumes_from_the_checkpoint_before(data_dir, tmp_path, jax_worker,
                                                              reference):
    """Killed in the save of ckpt-8, after its steps were logged: the rerun resumes from ckpt-4
    and logs steps 5..8 again, in place of the ones logged before the kill."""
    model_dir, marker = tmp_path / "m", tmp_path / "in_save"
    flags = cli_flags(data_dir, model_dir)
    proc = start(["-c", factories.HANG_IN_SAVE, "tensorflow.python.ops.gen_io_ops",
                  "merge_v2_checkpoints", "ckpt-8", str(marker), *flags],
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    factories.kill_9_in_the_save(proc, marker)
    assert sorted(logged_losses(read_train_log(str(model_dir)))) == list(range(1, 9))

    done = jax_worker.tool("tfxl.train.main", *flags, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resumed from {model_dir}/checkpoints/ckpt-4 at step 4" in done.stderr
    assert "dropped steps 5..8" in done.stderr, done.stderr[-3000:]
    parts = ModelDir(str(model_dir)).train_log_part_list()  # no step logged twice
    assert sum(len(open(path).readlines()) for _, _, path in parts) == STEPS
    assert_continues_exactly(read_train_log(str(model_dir)), reference)


@pytest.mark.large
@pytest.mark.subprocess
def test_a_jax_run_on_gs_resumes_and_the_tensorflow_tools_read_it(
        data_dir, tmp_path, gcs, gcs_worker, reference):
    """Data and model_dir in a bucket: tfxl-train on JAX, stopped by SIGTERM and rerun with the
    same command, trains as the local run did; tfxl-eval and tfxl-export, on TensorFlow, read
    its checkpoint from gs:// (the evaluation is the local run's)."""
    for root, _, files in os.walk(data_dir):
        for name in files:
            local = os.path.join(root, name)
            with open(local, "rb") as f:
                gcs.write(f"jax/data/{os.path.relpath(local, data_dir)}", f.read())
    data, run = gcs.url("jax/data"), gcs.url("jax/run")
    flags = cli_flags(data, run)
    marker = tmp_path / "in_the_host_loop"
    proc = start(["-c", STOPPED_IN_THE_HOST_LOOP, str(STOP_AT), str(marker), *flags], gcs)
    checkpoint = assert_stopped_with_a_checkpoint(*stop_with_sigterm(proc, marker), run)
    # The newest checkpoint is the stop's, and the run did not finish (read outside TensorFlow:
    # this process does not reach the emulator through gs://).
    state = gcs.read("jax/run/checkpoints/checkpoint").decode()
    assert f'model_checkpoint_path: "ckpt-{STOP_AT + 2}"' in state, state
    assert "jax/run/metrics.json" not in gcs.list("jax/run/")

    done = gcs.run([factories.console_script("tfxl-train"), *flags], env=JAX_ENV, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resumed from {checkpoint} at step {STOP_AT + 2}" in done.stderr, done.stderr[-3000:]
    records = [json.loads(line) for name in gcs.list("jax/run/train_log/")
               for line in gcs.read(name).decode().splitlines()]
    assert_continues_exactly(sorted(records, key=lambda r: r["step"]), reference)

    def tool(module, *args):
        result = gcs_worker.tool(module, *args, cwd=tmp_path)
        assert result.returncode == 0, (module, result.stdout[-2000:], result.stderr[-3000:])
        return result

    evaluation = ["--split=test"]
    tool("tfxl.train.evaluate", f"--data_dir={data}", f"--model_dir={run}", *evaluation,
         f"--output={gcs.url('jax/eval.json')}")
    tool("tfxl.train.evaluate", f"--data_dir={data_dir}", f"--model_dir={reference}",
         *evaluation, f"--output={tmp_path / 'eval.json'}")
    from_gs = json.loads(gcs.read("jax/eval.json"))
    local = json.loads((tmp_path / "eval.json").read_text())
    assert from_gs["tokens"] == local["tokens"] > 0
    assert from_gs["loss"] == pytest.approx(local["loss"], rel=1e-6)

    tool("tfxl.serving.export_main", f"--model={run}", f"--data_dir={data}",
         f"--output_dir={gcs.url('jax/export')}")
    assert "jax/export/1/saved_model.pb" in gcs.list("jax/export/")


# -- what only a JAX run can get wrong -----------------------------------------------------------

@pytest.mark.subprocess
@pytest.mark.parametrize("flags, needle", [
    (["--mixed_precision=mixed_float16"], "mixed_bfloat16"),
    (["--strategy=mirrored"], "--strategy=mirrored is a TensorFlow strategy"),
    (["--strategy=model_parallel", "--model_parallel=3"], "--model_parallel=3 does not divide"),
    (["--jax_coordinator=host:1234"], "needs --jax_processes"),
])
def test_a_mistake_on_jax_is_one_line_and_exit_status_2(data_dir, tmp_path, jax_worker, flags,
                                                        needle):
    """On the worker's four devices."""
    model_dir = tmp_path / "m"
    result = jax_worker.tool("tfxl.train.main", *cli_flags(data_dir, model_dir), *flags,
                             cwd=tmp_path)
    factories.assert_one_error_line(result, needle)
    assert not model_dir.exists()
