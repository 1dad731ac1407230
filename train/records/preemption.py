"""Preemption-safe training: SIGTERM and SIGINT stop a run with a checkpoint, on every worker at
the same step.

A pod VM is preempted with a SIGTERM (and a restart later); a user stops a run with Ctrl-C. While
`TrainingRun.train` trains, in the main thread:

* the first SIGTERM or SIGINT asks for a stop (`StopOnSignals`). The host loop in flight (up to
  `--steps_per_loop` steps inside one `tf.function`, the TPU Estimator's iterations_per_loop) runs
  to its end; there the controller saves the normal training checkpoint at that step (model,
  optimizer, memory, dropout seeds; the input position is the step), so resuming is exact, and
  raises `TrainingStopped` (a signal during an evaluation inside the run stops at the
  evaluation's end, at its step, not a host loop later), whose text is the one line tfxl-train
  prints: `stopped by SIGTERM at step 1234: checkpoint saved in
  <model_dir>/checkpoints/ckpt-1234; run the same command to resume`. Exit status 128 + the
  signal: 143 (SIGTERM), 130 (SIGINT). No metrics.json is written (it holds the results of a
  finished run);
* a SIGINT after that aborts at once, without saving: one `aborted ...` line on stderr, exit 130
  (the host loop in flight is lost; the previous checkpoint is where a rerun resumes);
* further SIGTERMs change nothing.

The previous handlers come back when training ends. A signal reaches Python's handler only once
the main thread is back in Python, i.e. after the host loop's `tf.function` returns; the handlers
here only record the signal: a thread woken through `signal.set_wakeup_fd` sees it at once, which
is what lets a second Ctrl-C abort in the middle of a host loop.

Several workers (MultiWorkerMirroredStrategy) must save the same step, or the resumed run would mix
workers at different steps: `StopRequests.agreed` runs after every host loop on every worker (the
loops are cut identically everywhere) and all-reduces each worker's signal, so every worker sees
the same answer at the same step, the signalled one and the others. One device, MirroredStrategy
and TPUStrategy have one Python process (one worker): its own signal is the answer.

The exchange is the backend's (train/backends/: an all-reduce over the replicas on TensorFlow, a
gather of the processes' values on JAX). Why not
`tf.distribute.experimental.PreemptionCheckpointHandler` (TensorFlow 2.21, read in
tensorflow/python/distribute/failure_handling/failure_handling.py): docs/training.md,
"Preemption and exit status".
"""

import dataclasses
import os
import signal
import sys
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclasses.dataclass(frozen=True)
class StopRequest:
    """A stop asked for by `signum`; `task` names the worker that received it when there are
    several ("worker 1"), else None."""
    signum: int
    task: str | None = None

    @property
    def name(self):
        return signal.Signals(self.signum).name

    @property
    def exit_status(self):
        """128 + the signal (143 SIGTERM, 130 SIGINT): "stopped on request, checkpoint saved,
        run again to resume", apart from 0 (done), 2 (user error), 3 (diverged), 1 (a crash)."""
        return 128 + self.signum


class TrainingStopped(Exception):
    """The run stopped on a `StopRequest` after saving the checkpoint of `step`; str() is the one
    line to print, `exit_status` the process's exit status."""

    def __init__(self, request: StopRequest, step, checkpoint_dir):
        self.request, self.step = request, step
        self.checkpoint = os.path.join(checkpoint_dir, f"ckpt-{step}")
        self.exit_status = request.exit_status
        by = f"{request.name} to {request.task}" if request.task else request.name
        super().__init__(f"stopped by {by} at step {step}: checkpoint saved in "
                         f"{self.checkpoint}; run the same command to resume")


def _record_only(signum, frame):
    """The Python-level handler: the signal is handled by `StopOnSignals._watch` (woken at once
    through the wakeup fd, while this runs only when the main thread is back in Python)."""


class StopOnSignals:
    """Context manager: SIGTERM and SIGINT ask for a stop while it is active (see the module
    docstring); `requested` is the first one's number, None before.

    Handlers can only be installed in the main thread: elsewhere (a notebook's worker thread, a
    test runner's) it does nothing and signals keep their effect. Handlers installed by Python are
    restored on exit; one installed outside Python cannot be: under MultiWorkerMirroredStrategy
    TensorFlow's C++ `SigtermNotifier` (started with the coordination service; it only records
    the signal, so a SIGTERM used to be ignored there) is invisible to `signal.getsignal`, and
    after training SIGTERM has its default effect there.
    """

    def __init__(self, log=None):
        self.requested = None
        self._log = log or (lambda message: print(message, file=sys.stderr, flush=True))
        self._active = False

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            return self
        self._read_end, self._write_end = os.pipe()
        os.set_blocking(self._write_end, False)  # set_wakeup_fd's requirement
        self._previous_wakeup_fd = signal.set_wakeup_fd(self._write_end,
                                                        warn_on_full_buffer=False)
        self._previous = {signum: signal.signal(signum, _record_only) for signum in STOP_SIGNALS}
        self._thread = threading.Thread(target=self._watch, name="tfxl-stop-signals",
                                        daemon=True)
        self._thread.start()
        self._active = True
        return self

    def __exit__(self, *exc_info):
        if not self._active:
            return False
        self._active = False
        for signum, previous in self._previous.items():  # handlers first: no signal is lost
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        signal.set_wakeup_fd(self._previous_wakeup_fd)
        os.close(self._write_end)  # the watcher reads end-of-file and returns
        self._thread.join()
        os.close(self._read_end)
        return False

    def _watch(self):
        while True:
            received = os.read(self._read_end, 64)
            if not received:
                return
            for signum in received:
                if signum in STOP_SIGNALS:
                    self._received(signum)

    def _received(self, signum):
        name = signal.Signals(signum).name
        if self.requested is None:
            self.requested = signum
            again = " (Ctrl-C again aborts without saving)" if signum == signal.SIGINT else ""
            self._log(f"{name}: stopping at the end of the host loop in flight, with a "
                      f"checkpoint{again}")
        elif signum == signal.SIGINT:
            self._log(f"aborted by a second {name}: nothing saved since the last checkpoint; "
                      "run the same command to resume from it")
            sys.stdout.flush()
            os._exit(128 + signum)


class StopRequests:
    """The stop decision every worker of a run takes at the same host-loop end.

    `backend` is the run's (`tfxl.train.backends.Backend`: its workers and their exchange).
    `signals` is the `StopOnSignals` to train within; `agreed()` (the controller's
    `stop_requested`) returns the `StopRequest` of the first worker (in cluster order) that
    received a signal, or None, the same on every worker. With several workers it is a collective:
    every worker must call it at the same points (the controller does, after every host loop but
    the last).
    """

    def __init__(self, backend, log=None):
        self.signals = StopOnSignals(log)
        self.tasks, self.own = backend.worker_tasks()
        self._per_worker = backend.stop_agreement()

    def agreed(self):
        own = self.signals.requested
        if self._per_worker is None:
            return StopRequest(own) if own else None
        for task, signum in zip(self.tasks, self._per_worker(own or 0)):
            if signum:
                return StopRequest(int(signum), task)
        return None
