"""tfxl-train on JAX as several processes (tfxl/tpu/jax_mesh.py: `--jax_coordinator`, one input
pipeline per process, global arrays over every process's devices): two processes of two
simulated CPU devices each, joined on 127.0.0.1, train as one process of four devices does,
step for step, from the same initial weights; only process 0 writes the model_dir's records;
a SIGTERM to one stops both at the same host-loop end and the rerun continues exactly.

The tests run under the suite's TensorFlow pytest: every trainer is a subprocess on JAX.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import factories
from factories import STARTED, free_port, no_process_left_behind  # noqa: F401 (autouse)
from backends import JAX_XLA_FLAGS
from tfxl.train.records.train_log import read_train_log

pytestmark = [pytest.mark.large, pytest.mark.subprocess]

T = 8            # segment and memory length of the test data
STREAMS = 8      # streams per split: the global batch
DEVICES = 4      # simulated CPU devices of a run, in all
PROCESSES = 2    # processes of a multi-process run, DEVICES // PROCESSES devices each
STEPS = 20
LOOP = 5         # --steps_per_loop
RELATIVE = 1e-5  # a multi-process step's loss against the one-process run's
TIMEOUT = 600    # seconds a run of the processes may take on a loaded 2-core machine
STOPPED = re.compile(r"^stopped by SIGTERM(?: to process (\d))? at step (\d+): checkpoint saved "
                     r"in (\S+); run the same command to resume$")

# tfxl-train that first saves the weights it starts from ({prefix}-{process index}.npz, every
# weight's whole value as each process sees it: `to_numpy` gathers another process's shards).
WITH_INITIAL_WEIGHTS = """
import sys
prefix, sys.argv = sys.argv[1], ["tfxl-train"] + sys.argv[2:]
import numpy as np
from tfxl.train.loop.jax_train_step import JaxTrainStep
original = JaxTrainStep.train

def train(self, num_steps):
    if self.step == 0:
        values = [self.strategy.to_numpy(v.value) for v in self.model.weights]
        np.savez(f"{prefix}-{self.strategy.process_index}.npz", *values)
    return original(self, num_steps)

JaxTrainStep.train = train
from tfxl.train.main import run
run()
"""


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return factories.random_bytes_data(tmp_path_factory.mktemp("multiprocess"), T, STREAMS)


def jax_env(devices):
    return {**{k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "TF_CONFIG")},
            "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": "",
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "XLA_FLAGS": f"{JAX_XLA_FLAGS} --xla_force_host_platform_device_count={devices}"}


def train_flags(data_dir, *extra):
    return [f"--data_dir={data_dir}", "--preset=tiny", f"--train_batch_size={STREAMS}",
            f"--tgt_len={T}", f"--mem_len={T}", "--n_layer=2", "--d_model=16", "--n_head=2",
            "--d_head=8", "--d_inner=32", "--dropout=0", "--dropatt=0", "--seed=0",
            f"--train_steps={STEPS}", f"--steps_per_loop={LOOP}", "--save_every=10",
            "--eval_every=10", "--max_eval_batches=2", "--train_log_seconds=0",
            "--lease_settle=0", *extra]




class Trainer:
    """One tfxl-train process on JAX; its stdout and stderr go to files (a pipe left unread
    would block a process while the test waits on the other)."""

    def __init__(self, args, *, devices, logs):
        self.out, self.err = logs.with_suffix(".out"), logs.with_suffix(".err")
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen([sys.executable, *args], env=jax_env(devices),
                                         stdout=out, stderr=err)
        STARTED.append(self.proc)

    def result(self):
        return self.proc.returncode, self.out.read_text(), self.err.read_text()


def start_processes(data_dir, model_dirs, *extra, wrapper=("-m", "tfxl.train.main"), logs):
    """tfxl-train as PROCESSES processes joined on 127.0.0.1 (process i on model_dirs[i])."""
    coordinator = f"--jax_coordinator=127.0.0.1:{free_port()}"
    logs.mkdir(parents=True, exist_ok=True)
    return [Trainer([*wrapper, *train_flags(data_dir, f"--model_dir={model_dir}", *extra),
                     coordinator, f"--jax_processes={PROCESSES}", f"--jax_process_id={index}"],
                    devices=DEVICES // PROCESSES, logs=logs / f"process{index}")
            for index, model_dir in enumerate(model_dirs)]


def finish(trainers):
    """Waits for every process; one that fails ends the others (they would wait on it in a
    collective until the timeout). Returns their (exit status, stdout, stderr)."""
    deadline = time.time() + TIMEOUT
    while time.time() < deadline:
        codes = [t.proc.poll() for t in trainers]
        if all(code is not None for code in codes):
            break
        if any(code not in (None, 0, 143) for code in codes):
            time.sleep(5)  # the others' own error first, if they have one
            for t in trainers:
                if t.proc.poll() is None:
                    t.proc.kill()
        time.sleep(0.2)
    for t in trainers:
        if t.proc.poll() is None:
            t.proc.kill()
        t.proc.wait()
    return [t.result() for t in trainers]


def assert_exits(results, code):
    for index, (status, out, err) in enumerate(results):
        assert status == code, (index, status, out[-2000:], err[-4000:])


@pytest.fixture(scope="module")
def one_process(data_dir, tmp_path_factory):
    """Runs of one process on DEVICES devices, once each: {strategy flags: (model_dir, initial
    weights)}."""
    runs = {}

    def run(*strategy):
        if strategy not in runs:
            root = tmp_path_factory.mktemp("one_process")
            model_dir, logs = root / "m", root / "logs"
            trainer = Trainer(["-c", WITH_INITIAL_WEIGHTS, str(root / "initial"),
                               *train_flags(data_dir, f"--model_dir={model_dir}", *strategy)],
                              devices=DEVICES, logs=logs)
            assert_exits(finish([trainer]), 0)
            runs[strategy] = model_dir, initial_weights(root / "initial-0.npz")
        return runs[strategy]
    return run


def initial_weights(path):
    with np.load(path) as saved:
        return [saved[f"arr_{i}"] for i in range(len(saved.files))]


def logged_losses(model_dir):
    return {r["step"]: r["loss"] for r in read_train_log(str(model_dir))}


def assert_same_losses(model_dir, reference_dir):
    losses, reference = logged_losses(model_dir), logged_losses(reference_dir)
    assert sorted(losses) == sorted(reference) == list(range(1, STEPS + 1))
    for step in reference:
        assert losses[step] == pytest.approx(reference[step], rel=RELATIVE), step
    return max(abs(losses[s] / reference[s] - 1) for s in reference)


def assert_same_checkpoint(path, reference_path):
    """Every value of two checkpoints (weights, optimizer slots, memory, seeds) agrees."""
    ours, theirs = tf.train.load_checkpoint(str(path)), tf.train.load_checkpoint(
        str(reference_path))
    keys = set(theirs.get_variable_to_shape_map())
    assert set(ours.get_variable_to_shape_map()) == keys
    for key in sorted(keys - {"_CHECKPOINTABLE_OBJECT_GRAPH"}):
        np.testing.assert_allclose(ours.get_tensor(key), theirs.get_tensor(key), rtol=1e-4,
                                   atol=1e-6, err_msg=key)


def listing(model_dir):
    """The files under `model_dir`, relative, TensorBoard's event files by their folder."""
    names = set()
    for path in model_dir.rglob("*"):
        if path.is_file():
            name = str(path.relative_to(model_dir))
            names.add(name.split("events.out.tfevents")[0] + "events" if "tfevents" in name
                      else name)
    return names


def test_two_processes_train_data_parallel_as_one_process_of_four_devices(data_dir, tmp_path,
                                                                          one_process):
    """Process 1 runs on a model_dir of its own here (a fresh run reads nothing from it): what
    it writes is visible apart from process 0's, and it is only its checkpoint copies."""
    model_dirs = [tmp_path / "m", tmp_path / "m_process1"]
    results = finish(start_processes(data_dir, model_dirs, wrapper=["-c", WITH_INITIAL_WEIGHTS,
                                                                    str(tmp_path / "initial")],
                                     logs=tmp_path))
    assert_exits(results, 0)
    for _, out, _ in results:
        assert out.strip().splitlines()[-1].startswith(f"done: step {STEPS}")
    reference, reference_initial = one_process()

    # The same initial weights on every process and in the one-process run.
    for index in range(PROCESSES):
        initial = initial_weights(tmp_path / f"initial-{index}.npz")
        assert len(initial) == len(reference_initial)
        for ours, theirs in zip(initial, reference_initial):
            np.testing.assert_array_equal(ours, theirs)

    # Only process 0 writes the run's records; process 1 only its checkpoint copies.
    assert listing(model_dirs[0]) == listing(reference)
    assert listing(model_dirs[1]) == {"tmp_worker_checkpoints/1/checkpoint",
                                      *(f"tmp_worker_checkpoints/1/ckpt-{step}.{suffix}"
                                        for step in (10, 20)
                                        for suffix in ("index", "data-00000-of-00001"))}
    for name in ("run.json", "data.json", "config.json"):
        record, theirs = (json.loads((d / name).read_text()) for d in (model_dirs[0], reference))
        record.pop("history", None), theirs.pop("history", None)  # when each run started
        assert record == theirs, name

    worst = assert_same_losses(model_dirs[0], reference)
    print(f"data_parallel: largest relative loss difference {worst:.2e}")
    assert_same_checkpoint(model_dirs[0] / "checkpoints" / f"ckpt-{STEPS}",
                           reference / "checkpoints" / f"ckpt-{STEPS}")
    assert_same_checkpoint(model_dirs[1] / "tmp_worker_checkpoints" / "1" / f"ckpt-{STEPS}",
                           reference / "checkpoints" / f"ckpt-{STEPS}")
    metrics, theirs = (json.loads((d / "metrics.json").read_text())
                       for d in (model_dirs[0], reference))
    assert metrics["valid"]["loss"] == pytest.approx(theirs["valid"]["loss"], rel=RELATIVE)


def test_two_processes_train_model_parallel_as_one_process_of_four_devices(data_dir, tmp_path,
                                                                           one_process):
    """A (batch 2, model 2) mesh: each process holds one batch row of the mesh, its two devices
    one half of every split weight."""
    strategy = ("--strategy=model_parallel", "--model_parallel=2")
    model_dir = tmp_path / "m"
    results = finish(start_processes(data_dir, [model_dir] * PROCESSES, *strategy,
                                     logs=tmp_path))
    assert_exits(results, 0)
    reference, _ = one_process(*strategy)
    assert listing(model_dir) == listing(reference) | {
        "tmp_worker_checkpoints/1/checkpoint",
        *(f"tmp_worker_checkpoints/1/ckpt-{step}.{suffix}" for step in (10, 20)
          for suffix in ("index", "data-00000-of-00001"))}
    worst = assert_same_losses(model_dir, reference)
    print(f"model_parallel: largest relative loss difference {worst:.2e}")
    assert_same_checkpoint(model_dir / "checkpoints" / f"ckpt-{STEPS}",
                           reference / "checkpoints" / f"ckpt-{STEPS}")


def test_sigterm_to_one_process_stops_both_at_the_same_step_and_the_rerun_resumes_exactly(
        data_dir, tmp_path, one_process):
    """SIGTERM to process 1 only (a preempted host): both agree at the end of the host loop in
    flight (train/records/preemption.py's `StopRequests`), save that step and exit 143; the rerun of
    both continues as the uninterrupted one-process run."""
    model_dir = tmp_path / "m"
    trainers = start_processes(data_dir, [model_dir] * PROCESSES, logs=tmp_path / "first")
    deadline = time.time() + TIMEOUT
    # The first host loop's steps in the log (--train_log_seconds=0): both train, and both
    # handle signals (the handlers are in place from before the first loop to the last).
    while (not read_train_log(str(model_dir)) and time.time() < deadline
           and all(t.proc.poll() is None for t in trainers)):
        time.sleep(0.05)
    assert read_train_log(str(model_dir)), [t.result() for t in trainers]
    trainers[1].proc.send_signal(signal.SIGTERM)
    results = finish(trainers)
    assert_exits(results, 143)
    stops = []
    for _, out, err in results:
        assert "Traceback" not in err, err[-4000:]
        lines = [STOPPED.match(line.strip()) for line in out.splitlines() if "stopped by" in line]
        assert len(lines) == 1 and lines[0], out[-2000:]
        stops.append(lines[0].groups())
    assert stops[0] == stops[1], stops  # the same signalled process, step and checkpoint
    signalled, step, checkpoint = stops[0]
    assert signalled == "1", stops
    step = int(step)
    # Host loops end at 1 (--short_first_loops: one step first on JAX), then every LOOP steps,
    # cut at the checkpoint of step 10.
    assert step in (1, 6, 10, 15), step
    factories.assert_stopped_with_its_checkpoint(model_dir, step, checkpoint,
                                                 max(logged_losses(model_dir)))

    results = finish(start_processes(data_dir, [model_dir] * PROCESSES, logs=tmp_path / "rerun"))
    assert_exits(results, 0)
    for _, out, err in results:
        assert f"resumed from {checkpoint} at step {step}" in err, err[-4000:]
    assert json.loads((model_dir / "metrics.json").read_text())["start_step"] == step
    parts = sum(len(open(path).readlines()) for path in (model_dir / "train_log").iterdir())
    assert parts == STEPS  # no step logged twice
    reference, _ = one_process()
    worst = assert_same_losses(model_dir, reference)
    print(f"stopped at step {step}, resumed: largest relative loss difference {worst:.2e}")
