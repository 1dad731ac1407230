"""SIGTERM and SIGINT stop training with a checkpoint at the end of the host loop in flight, on
every worker at the same step (train/records/preemption.py); the rerun continues step for step as
if the run had never stopped."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import factories
from factories import STARTED, no_process_left_behind  # noqa: F401 (autouse)
from tfxl.model_dir import ModelDir, check_or_store_config
from tfxl.train.loop.controller import Controller
from tfxl.train.loop.optimization import OptimizerParams
from tfxl.train.backends import for_strategy
from tfxl.train.records.preemption import StopOnSignals, StopRequest, StopRequests, TrainingStopped
from tfxl.train.records.train_log import read_train_log

T = 8          # segment length of the test data
STREAMS = 8    # streams per split (the global batch)
STEPS = 60     # steps of every run here
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
STOPPED = re.compile(r"^stopped by (SIGTERM|SIGINT)(?: to (worker \d))? at step (\d+): checkpoint "
                     r"saved in (\S+); run the same command to resume$")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return factories.random_bytes_data(tmp_path_factory.mktemp("preemption"), T, STREAMS,
                                       train_bytes=40000)


def cli_flags(data_dir, model_dir, dropout=0.1, steps=STEPS, steps_per_loop=2, save_every=50):
    return [f"--data_dir={data_dir}", f"--model_dir={model_dir}", "--n_layer=1", "--d_model=16",
            "--n_head=2", "--d_head=8", "--d_inner=32", f"--dropout={dropout}", f"--tgt_len={T}",
            f"--mem_len={T}", f"--train_batch_size={STREAMS}", f"--train_steps={steps}",
            f"--steps_per_loop={steps_per_loop}", f"--save_every={save_every}",
            "--learning_rate=0.003", "--train_log_seconds=0", "--lease_settle=0"]




def popen(args, env=ENV):
    proc = subprocess.Popen([sys.executable, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    STARTED.append(proc)
    return proc


def start(flags, tf_config=None):
    return popen(["-m", "tfxl.train.main", *flags],
                 {**ENV, "TF_CONFIG": tf_config} if tf_config else ENV)


def finish(proc):
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


def run_cli(flags):
    return finish(start(flags))


def run_in_process(flags):
    """tfxl-train in the test process (factories.run_in_process): for the runs that no signal
    reaches, the uninterrupted references and the resumed runs' last one."""
    result = factories.run_in_process("tfxl.train.main", *flags)
    return result.returncode, result.stdout, result.stderr


def logged_losses(model_dir):
    return {r["step"]: r["loss"] for r in read_train_log(str(model_dir))}


def logged_steps(model_dir):
    """The steps logged so far (--train_log_seconds=0: a part after every host loop)."""
    return len(read_train_log(str(model_dir)))


def signal_at_a_random_moment(proc, model_dir, signum, rng, after=0):
    """Sends `signum` to `proc` a random time (up to 1 s) after it logs its first step (past
    step `after`, where it resumed), or as soon as it is halfway from there: a random moment
    inside the run, whatever the machine's speed."""
    deadline = time.time() + 300
    while logged_steps(model_dir) <= after and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert logged_steps(model_dir) > after, "no step was logged"
    until = time.time() + rng.uniform(0.0, 1.0)
    while time.time() < until and logged_steps(model_dir) < (after + STEPS) // 2:
        time.sleep(0.005)
    proc.send_signal(signum)


def the_stop_line(out, err):
    """(signal name, worker or None, step, checkpoint) of the one line a stopped run prints."""
    assert "Traceback" not in err, err[-3000:]
    lines = [STOPPED.match(line.strip()) for line in out.splitlines() if "stopped by" in line]
    assert len(lines) == 1 and lines[0], out[-2000:]
    name, worker, step, checkpoint = lines[0].groups()
    return name, worker, int(step), checkpoint


def assert_resumes_exactly(model_dir, reference, stopped_at):
    losses = logged_losses(model_dir)
    assert sorted(losses) == list(range(1, STEPS + 1))
    parts = ModelDir(str(model_dir)).train_log_part_list()  # no step logged twice
    assert sum(len(open(path).readlines()) for _, _, path in parts) == STEPS
    for step in range(1, STEPS + 1):
        assert losses[step] == pytest.approx(reference[step], abs=1e-5), (step, stopped_at)


@pytest.fixture(scope="module")
def reference(data_dir, tmp_path_factory):
    """Uninterrupted one-device runs in the test process: {dropout: model_dir}, each trained once
    on demand (logged_losses(model_dir) are its losses, metrics.json its evaluation)."""
    runs = {}

    def model_dir(dropout, *extra):
        if dropout not in runs:
            runs[dropout] = tmp_path_factory.mktemp("reference") / "m"
            code, _, err = run_in_process([*cli_flags(data_dir, runs[dropout], dropout), *extra])
            assert code == 0, err[-3000:]
        return runs[dropout]
    return model_dir


# -- one device ----------------------------------------------------------------------------------

def assert_stopped_at_a_host_loop_end(model_dir, signum, code, out, err):
    """The run stopped by `signum` saved at the end of a host loop and said so; returns the
    step."""
    assert code == 128 + signum, (code, err[-3000:])  # 143 SIGTERM, 130 SIGINT
    name, worker, step, checkpoint = the_stop_line(out, err)
    assert (name, worker) == (signal.Signals(signum).name, None)
    # The end of a host loop: 1, 2 (--short_first_loops), then every 2 steps.
    assert 0 < step < STEPS and (step == 1 or step % 2 == 0), step
    assert checkpoint == str(model_dir / "checkpoints" / f"ckpt-{step}")
    assert tf.train.latest_checkpoint(str(model_dir / "checkpoints")) == checkpoint
    assert max(logged_losses(model_dir)) == step  # the log ends where the checkpoint is
    assert not (model_dir / "metrics.json").exists()  # the run did not finish
    return step


@pytest.mark.large
@pytest.mark.subprocess
def test_a_signal_saves_at_the_end_of_the_host_loop_and_the_rerun_resumes_exactly(
        data_dir, tmp_path, reference):
    """SIGTERM stops the first run, SIGINT the rerun (a resumed run stops like a fresh one), and
    the third run finishes: every step's loss is the uninterrupted run's."""
    rng = np.random.default_rng(1615)  # random moments, the same ones every run
    model_dir = tmp_path / "m"
    checkpoint, resumed_at = None, 0
    for signum in (signal.SIGTERM, signal.SIGINT):
        proc = start(cli_flags(data_dir, model_dir))
        signal_at_a_random_moment(proc, model_dir, signum, rng, after=resumed_at)
        code, out, err = finish(proc)
        if checkpoint:
            assert f"resumed from {checkpoint} at step {resumed_at}" in err, err[-3000:]
        step = assert_stopped_at_a_host_loop_end(model_dir, signum, code, out, err)
        assert step > resumed_at, (signal.Signals(signum).name, step, resumed_at)
        checkpoint, resumed_at = str(model_dir / "checkpoints" / f"ckpt-{step}"), step

    code, out, err = run_in_process(cli_flags(data_dir, model_dir))  # no signal: in this process
    assert code == 0, err[-3000:]
    assert f"resumed from {checkpoint} at step {resumed_at}" in err
    assert out.strip().splitlines()[-1].startswith(f"done: step {STEPS}")
    assert json.loads((model_dir / "metrics.json").read_text())["start_step"] == resumed_at
    assert_resumes_exactly(model_dir, logged_losses(reference(0.1)),
                           resumed_at)  # dropout: RNG restored


IN_THE_HOST_LOOP = """
import sys
marker, sys.argv = sys.argv[1], ["tfxl-train"] + sys.argv[2:]
import tensorflow as tf
from tfxl.train.loop.train_step import TrainStep
original = TrainStep.train

def train(self, num_steps):  # traces the host loop, says so, then runs it (in TF's C++ only)
    self.train_loop_begin()
    self._loop.get_concrete_function(self._iterator, tf.constant(num_steps))
    open(marker, "w").close()
    return original(self, num_steps)

TrainStep.train = train
from tfxl.train.main import run
run()
"""


@pytest.mark.large
@pytest.mark.subprocess
def test_a_second_ctrl_c_aborts_in_the_middle_of_a_host_loop(data_dir, tmp_path):
    """Python runs a signal handler only once the main thread is back in Python, i.e. after the
    host loop: the abort must not wait for it (here, one host loop of a million steps)."""
    model_dir, marker = tmp_path / "m", tmp_path / "in_the_host_loop"
    proc = popen(["-c", IN_THE_HOST_LOOP, str(marker),
                  *cli_flags(data_dir, model_dir, steps=10**6, steps_per_loop=10**6,
                             save_every=0), "--noshort_first_loops"])  # the first loop is long
    deadline = time.time() + 300
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert marker.exists(), "the host loop never started"
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)  # a million steps: the loop is not waited for
    assert proc.returncode == 130, err[-3000:]
    assert "SIGINT: stopping at the end of the host loop in flight" in err
    assert "aborted by a second SIGINT: nothing saved since the last checkpoint" in err
    assert "Traceback" not in err and "stopped by" not in out
    assert not (model_dir / "checkpoints").exists()


# -- two workers ---------------------------------------------------------------------------------

def free_ports(n):
    import socket
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def start_workers(flags):
    workers = [f"127.0.0.1:{p}" for p in free_ports(2)]
    return [start([*flags, "--strategy=multi_worker_mirrored"], json.dumps(
        {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}))
        for index in range(2)]


@pytest.mark.large
@pytest.mark.subprocess
def test_sigterm_to_one_of_two_workers_stops_both_at_the_same_step_and_both_resume_exactly(
        data_dir, tmp_path, reference):
    """MultiWorkerMirroredStrategy, two local processes: SIGTERM to worker 1 only; both save the
    same step (the chief in checkpoints/, worker 1 its copy) and exit 143; restarted, they
    continue as an uninterrupted run on one device (dropout off): two workers train as one
    device does, from step 1 to the stop and from the checkpoint on, and evaluate as it does
    (each with its replica's key/value memory) at the end."""
    rng = np.random.default_rng(1615)
    model_dir = tmp_path / "m"
    evaluation = ["--eval_every=60", "--max_eval_batches=5"]  # once, at the last step
    flags = [*cli_flags(data_dir, model_dir, dropout=0.0), *evaluation]
    chief, worker = start_workers(flags)
    signal_at_a_random_moment(worker, model_dir, signal.SIGTERM, rng)
    results = [finish(chief), finish(worker)]
    stops = []
    for code, out, err in results:
        assert code == 143, (code, err[-3000:])
        stops.append(the_stop_line(out, err))
    assert stops[0] == stops[1], stops  # the same line on both: same signal, worker, step
    name, signalled, step, checkpoint = stops[0]
    assert (name, signalled) == ("SIGTERM", "worker 1") and 0 < step < STEPS, stops
    factories.assert_stopped_with_its_checkpoint(model_dir, step, checkpoint,
                                                 max(logged_losses(model_dir)))

    for code, out, err in [finish(p) for p in start_workers(flags)]:
        assert code == 0, err[-3000:]
        assert out.strip().splitlines()[-1].startswith(f"done: step {STEPS}")
    one_device = reference(0.0, *evaluation)
    assert_resumes_exactly(model_dir, logged_losses(one_device), step)
    assert tf.train.latest_checkpoint(str(model_dir / "checkpoints")).endswith(f"-{STEPS}")
    evaluated = [json.loads((d / "metrics.json").read_text())["valid"]
                 for d in (one_device, model_dir)]
    assert evaluated[1]["tokens"] == evaluated[0]["tokens"] > 0
    assert evaluated[1]["loss"] == pytest.approx(evaluated[0]["loss"], abs=1e-5)


# -- in one process: the signal window and the controller ----------------------------------------

@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="signal handlers are installed in the main thread only")
def test_the_handlers_are_in_place_only_while_training_and_the_first_signal_asks_to_stop():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    before_wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(before_wakeup)
    said = []
    with StopOnSignals(log=said.append) as stops:
        assert all(signal.getsignal(s) != before[s] for s in before)
        assert stops.requested is None
        os.kill(os.getpid(), signal.SIGTERM)  # noted at once by the watcher thread
        deadline = time.time() + 10
        while stops.requested is None and time.time() < deadline:
            time.sleep(0.01)
        assert stops.requested == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGTERM)  # a second SIGTERM changes nothing
        time.sleep(0.2)
    assert {s: signal.getsignal(s) for s in before} == before
    assert signal.set_wakeup_fd(before_wakeup) == before_wakeup
    assert said == ["SIGTERM: stopping at the end of the host loop in flight, with a checkpoint"]
    # Outside the main thread nothing is installed.
    seen = []
    thread = threading.Thread(target=lambda: seen.append(StopOnSignals().__enter__()._active))
    thread.start()
    thread.join()
    assert seen == [False]


def test_one_process_is_one_worker_and_its_own_signal_is_the_answer(mirrored):
    for strategy in (tf.distribute.get_strategy(), mirrored):
        assert for_strategy(strategy).worker_tasks() == (["worker 0"], 0)
        stops = StopRequests(for_strategy(strategy))
        assert stops.agreed() is None
        stops.signals.requested = signal.SIGINT
        assert stops.agreed() == StopRequest(signal.SIGINT)
    assert StopRequest(signal.SIGTERM).exit_status == 143
    assert StopRequest(signal.SIGINT, "worker 1").exit_status == 130


def run_saving_into(data_dir, tmp_path, steps_per_loop):
    """A TrainingRun of 20 steps in tmp_path, and the list its checkpoint's saves append to."""
    config = factories.tiny_config(vocab_size=json.loads(
        open(os.path.join(data_dir, "manifest.json")).read())["vocab_size"],
        n_layer=1, d_head=8, d_inner=32, tgt_len=T, mem_len=T)
    check_or_store_config(str(tmp_path), config)
    runner = factories.language_model_run(
        config, data_dir=data_dir, model_dir=str(tmp_path), global_batch=STREAMS,
        optimizer=OptimizerParams(learning_rate=3e-3, train_steps=20),
        steps_per_loop=steps_per_loop)
    saved = []
    save = runner.checkpoint.save
    runner.checkpoint.save = lambda step: saved.append(step) or save(step)
    return runner, saved


def test_the_controller_saves_at_the_loop_end_skips_the_evaluation_and_stops(data_dir, tmp_path):
    runner, saved = run_saving_into(data_dir, tmp_path, 3)
    asked, evaluated = [], []

    def stop_requested():
        asked.append(runner.train_step.step)
        return StopRequest(signal.SIGTERM) if len(asked) == 2 else None

    controller = Controller(runner.train_step, runner.checkpoint, train_steps=20,
                            steps_per_loop=3, save_every=6, eval_every=4,
                            evaluate=lambda: evaluated.append(runner.train_step.step) or {},
                            stop_requested=stop_requested)
    with pytest.raises(TrainingStopped) as stopped:
        controller.train()
    # Host loops of 3 steps, cut at 4 for the evaluation; the stop asked for at 4 saves there
    # (no save was due) and the evaluation due then is not run.
    assert asked == [3, 4] and saved == [4] and evaluated == []
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-4")
    assert stopped.value.step == 4 and stopped.value.exit_status == 143
    assert str(stopped.value) == (f"stopped by SIGTERM at step 4: checkpoint saved in "
                                  f"{tmp_path}/checkpoints/ckpt-4; run the same command to resume")


def test_a_signal_during_an_evaluation_stops_at_its_end_with_that_steps_checkpoint(
        data_dir, tmp_path):
    """SIGTERM while the run evaluates (a preempted VM's grace period is short): the stop is
    taken when the evaluation ends, at its step, not a host loop later; exit status 143."""
    runner, saved = run_saving_into(data_dir, tmp_path, 2)
    signals, evaluated = [], []

    def evaluate():  # the signal arrives while the evaluation at step 4 runs
        evaluated.append(runner.train_step.step)
        signals.append(signal.SIGTERM)
        return {}

    controller = Controller(runner.train_step, runner.checkpoint, train_steps=20,
                            steps_per_loop=2, save_every=10, eval_every=4, evaluate=evaluate,
                            stop_requested=lambda: StopRequest(signals[0]) if signals else None)
    with pytest.raises(TrainingStopped) as stopped:
        controller.train()
    assert evaluated == [4] and saved == [4] and runner.train_step.step == 4
    assert stopped.value.step == 4 and stopped.value.exit_status == 143


# -- why not PreemptionCheckpointHandler (docs/training.md, "Preemption and exit status") ---------

def test_tensorflows_preemption_handler_does_nothing_on_gcp_cpu_and_tpu_vms_and_adds_a_key(
        tmp_path, monkeypatch):
    """The two findings that rule it out, pinned so that a TensorFlow that changes them is
    noticed: on a Google Cloud CPU or TPU VM (detected through the metadata server, faked here)
    it never saves, though its watcher reports a termination at once; elsewhere it adds a
    `checkpointed_runs` variable to the checkpoint it is given, which the checkpoints of earlier
    tfxl versions lack (restore_fitting refuses them then)."""
    import http.server
    from tensorflow.python.distribute.failure_handling import failure_handling_util

    class Metadata(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"a-vm")

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    done = []
    config = tf.distribute.experimental.TerminationConfig(
        termination_watcher_fn=lambda: True, exit_fn=lambda: done.append("exit"),
        save_fn=lambda: done.append("save"))
    try:
        monkeypatch.setenv("GCE_METADATA_IP", f"127.0.0.1:{server.server_port}")
        assert failure_handling_util.detect_platform().name == "GCE_CPU"
        handler = tf.distribute.experimental.PreemptionCheckpointHandler(
            None, tf.train.Checkpoint(v=tf.Variable(0.0)), str(tmp_path / "gcp"), config)
        time.sleep(1.5)  # its watcher, were there one, polls every second
        for _ in range(3):
            handler.run(lambda: None)
            handler.save_checkpoint_if_preempted()
        assert done == []
    finally:
        server.shutdown()
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:1")  # nothing listens: not on GCP
    checkpoint = tf.train.Checkpoint(v=tf.Variable(0.0))
    tf.distribute.experimental.PreemptionCheckpointHandler(
        None, checkpoint, str(tmp_path / "elsewhere"),
        tf.distribute.experimental.TerminationConfig(termination_watcher_fn=lambda: False))
    assert "checkpointed_runs" in {name.split("/")[0] for name, _ in tf.train.list_variables(
        checkpoint.write(str(tmp_path / "written")))}
