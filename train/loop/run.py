"""The generic training run: what every training job does around its task
(train/tasks/task.py).

`TrainingRun` is the same for the language model (tfxl-train, make demo) and the document
classifier (tfxl-classify-train): the checks before anything is written, the lease
(train/records/lease.py), the model_dir's records (tfxl/model_dir.py,
train/records/run_record.py), resuming (tfxl/checkpoints/training.py,
train/records/train_log.py), the controller with its log sinks (train/loop/controller.py),
SIGTERM/SIGINT (train/records/preemption.py) and metrics.json. What differs between models
(data, model, training memory, loss, evaluation, results) is the task's; what differs between
Keras backends is train/backends/'s, which builds the train step (train/loop/train_step.py,
train/loop/jax_train_step.py: the optimizer, the training memory and the compiled step), the
evaluator and the checkpoint. Its options are one frozen `RunOptions`, given by keyword.

A task's training memory lives on the replicas across host loops (train/loop/memory_state.py)
and is checkpointed with the model, optimizer, step and dropout seeds, so a resumed run
continues exactly where the last checkpoint stopped.
"""

import dataclasses
import sys
import time

import keras
import tensorflow as tf

from tfxl.checkpoints.finding import checkpoints_newest_first
from tfxl.cli.quiet import stream_is_terminal
from tfxl.files import read_json, write_json_atomically
from tfxl.model_dir import METRICS_FIELDS, ModelDir, check_or_store_config
from tfxl.train import backends
from tfxl.train.loop.controller import Controller, ProgressBar, ProgressLines, TensorBoardScalars
from tfxl.train.records.lease import Lease, LeaseParams
from tfxl.train.loop.optimization import OptimizerParams
from tfxl.train.records.preemption import StopRequests, TrainingStopped
from tfxl.train.records.run_record import RunRecord, run_settings
from tfxl.train.tasks.task import Task
from tfxl.train.records.train_log import FLUSH_SECONDS, TrainLog, resume_train_log
from tfxl.train.loop.step_base import TrainingDiverged

__all__ = ["RunOptions", "TrainingDiverged", "TrainingRun", "TrainingStopped", "run_progress",
           "train_from_command_line"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How a `TrainingRun` trains, whatever its task.

    model_dir: checkpoints, config.json, run.json, lease, train log, TensorBoard, metrics.json.
    global_batch: rows per step (streams or documents), divisible by the replicas.
    optimizer: the optimizer and its schedule; its train_steps is the step the run trains to.
    mixed_precision: the Keras dtype policy name. jit_compile: XLA-compile each replica's step.
    steps_per_loop: the longest host loop. seed: weights, dropout and input order. The
      process's dtype policy and seed are these two, set once before the run is built
      (`tfxl.train.backends.configure_process(mixed_precision=..., seed=...)`).
    is_chief: this worker writes the model_dir's records (its backend's `is_chief`).
    allow_run_changes: continue a checkpoint with settings other than run.json's
      (train/records/run_record.py). lease: the model_dir lease's `LeaseParams`
      (train/records/lease.py).
    train_log_seconds: how often the train log writes its new lines (train/records/train_log.py).
    short_first_loops: the first host loops end 1, 2, 4, ... steps in (on JAX one loop of one
      step), so that progress shows from the first step (train/loop/controller.py's
      `Controller`).
    """

    model_dir: str
    global_batch: int
    optimizer: OptimizerParams
    mixed_precision: str = "float32"
    jit_compile: bool = False
    steps_per_loop: int = 100
    seed: int = 0
    is_chief: bool = True
    allow_run_changes: bool = False
    lease: LeaseParams = LeaseParams()
    train_log_seconds: float = FLUSH_SECONDS
    short_first_loops: bool = False


def train_from_command_line(run, train_steps, **options):
    """`run.train(**options)` for a training tool's main. Returns (metrics, None) when it
    trained, or (None, exit status) when there was nothing more to do or a signal stopped it
    (saved; 143/130, BUILD.md), each said on stdout."""
    try:
        metrics = run.train(**options)
    except TrainingStopped as stopped:
        print(stopped)
        return None, stopped.exit_status
    if metrics.pop("nothing_to_do", False):
        print(f"nothing to do: {run.model_dir} is already trained to step {metrics['step']} "
              f"(--train_steps={train_steps}); its metrics.json is kept")
        return None, 0
    return metrics, None


def run_progress(train_steps, start_step, metric, units_per_step, verbose=1, unit="tokens"):
    """The run's progress on stdout: a Keras bar on a terminal; in a log or a pipe one plain line
    per host loop (a bar there is runs of backspaces, carriage returns and colour codes)."""
    if stream_is_terminal(sys.stdout):
        return ProgressBar(train_steps, start_step, metric, verbose)
    return ProgressLines(train_steps, metric, units_per_step, verbose, unit)


class TrainingRun:
    """One training job: trains `task`'s model to `options.optimizer.train_steps`, checkpointing,
    evaluating and recording it in `options.model_dir` (`train`).

    The constructor reads and checks (the data, run.json's settings, a warm start's source) and
    builds (the model, the train step, the evaluator, the checkpoint); it writes nothing. The
    process's dtype policy and seed are set before (`tfxl.train.backends.configure_process`,
    which the tools call): the policy must be `options.mixed_precision`.

    Args:
      task: a `tfxl.train.tasks.task.Task` (what is trained and how it is evaluated).
      strategy: the tf.distribute strategy every model and step is built under; on JAX
        (KERAS_BACKEND=jax) a `tfxl.tpu.jax_mesh.JaxDistribution` (train/backends/ builds the
        backend's step, evaluator and checkpoint for it).
      options: a `RunOptions`.
      log: where the constructor's notes go (the run's own: `train`'s log).
    """

    def __init__(self, task: Task, *, strategy, options: RunOptions, log=print):
        policy = keras.config.dtype_policy().name
        if policy != options.mixed_precision:
            raise ValueError(f"options.mixed_precision={options.mixed_precision!r} is not the "
                             f"process's Keras dtype policy, {policy!r}: call "
                             "tfxl.train.backends.configure_process(mixed_precision=..., "
                             "seed=...) before the run is built")
        self.task, self.strategy, self.options = task, strategy, options
        self.backend = backend = backends.for_strategy(strategy)
        self.config, self.model_dir = task.config, options.model_dir
        self.global_batch, self.steps_per_loop = options.global_batch, options.steps_per_loop
        self.train_steps, self.is_chief = options.optimizer.train_steps, options.is_chief
        # First: a `checkpoints` that is a file would read as "no checkpoint yet".
        ModelDir(options.model_dir).check_layout()
        self.data = task.load_data(strategy, model_dir=options.model_dir, seed=options.seed)
        resuming = bool(checkpoints_newest_first(ModelDir(options.model_dir).checkpoints))
        # The run's recorded settings (run.json) decide the schedule's length; reads only.
        settings = {**run_settings(options.optimizer, options.global_batch,
                                   options.mixed_precision, options.seed, options.steps_per_loop,
                                   backend),
                    **task.recorded_settings(self.data)}
        self.run_record = RunRecord.resolve(options.model_dir, settings, self.train_steps,
                                            resuming=resuming,
                                            allow_changes=options.allow_run_changes)
        optimizer = dataclasses.replace(options.optimizer,
                                        schedule_steps=self.run_record.schedule_steps)
        self.model = task.build_model(strategy)
        # The weights a new run started from (recorded in metrics.json), or None.
        self.init_checkpoint = task.warm_start(self.model, self.data,
                                               model_dir=options.model_dir, resuming=resuming,
                                               log=log)
        worker_id = None if options.is_chief else backend.worker_index
        self.train_step = backend.train_step(task, self.model, data=self.data,
                                             global_batch=options.global_batch,
                                             optimizer=optimizer,
                                             mixed_precision=options.mixed_precision,
                                             jit_compile=options.jit_compile)
        self.checkpoint = backend.training_checkpoint(
            self.model, optimizer=self.train_step.optimizer, memory=self.train_step.memory,
            model_dir=options.model_dir, worker_id=worker_id)
        # Evaluations inside a run are quiet: the run's own progress is on screen.
        self.evaluator = task.build_evaluator(self.model, strategy, self.data,
                                              global_batch=options.global_batch,
                                              steps_per_loop=options.steps_per_loop,
                                              jit_compile=options.jit_compile)

    @property
    def metric(self):
        """The metric shown beside the training loss ("bpc", "ppl"), or None."""
        return self.task.metric(self.data)

    def evaluate(self, split="valid", **settings):
        """The task's evaluation of `split` with the current weights (settings: the task's, e.g.
        the language model's batch_size, tgt_len, mem_len, max_batches)."""
        return self.task.evaluate(self.evaluator, self.data, split, **settings)

    def restore(self, log=print):
        """Restores the newest readable checkpoint (see TrainingCheckpoint); the input then
        continues at the restored step."""
        restored = self.checkpoint.restore(log)
        self.train_step.rewind_input()
        return restored

    def train(self, *, save_every=None, eval_every=None, max_eval_batches=None, log=print,
              check_compiled=None):
        """Trains to `train_steps`; returns the final metrics dict (also in metrics.json).

        check_compiled: called with the bytes the compiled first host loop holds at its peak on
        one device, where the backend compiles it before it runs and says (JAX's
        `memory_analysis()`), before anything is written; it raises to refuse the run (the
        tools' plan: train/planning/plan.py `check_compiled`).

        A model_dir already at `train_steps` has nothing to train: its metrics.json (the results of
        the run that did the work) is kept and returned with "nothing_to_do": True added.

        SIGTERM or SIGINT (in the main thread) stops the run at the end of the host loop in flight,
        on every worker at the same step: that step's checkpoint is saved and `TrainingStopped`
        raised (its text says where to resume); no metrics.json is written
        (train/records/preemption.py).

        Every check that can refuse the run comes before anything is written into the model_dir:
        the model_dir's layout (`checkpoints` a directory, run.json a file, ...), the data
        (manifest, shard sizes, evaluation shards' CRCs), the model (config.json), the run's
        settings (run.json, in the constructor), another live trainer (lease.json), the
        checkpoint (restored: it must fit), a finished run's metrics.json, and the train input
        (built at the restored step, which reads its shards' CRCs). Then the lease is taken and
        the model_dir claimed.
        """
        ModelDir(self.model_dir).check_layout()  # again: it may have changed since the constructor
        self.task.check_data(self.data, global_batch=self.global_batch,
                             evaluates=bool(eval_every))
        lease = Lease(self.model_dir, self.options.lease, log) if self.is_chief else None
        if self.is_chief:
            check_or_store_config(self.model_dir, self.config, store=False,
                                  kind=self.task.run_kind)
            lease.check()
        restored = self.restore(log)
        step = self.train_step.step
        metrics_path = ModelDir(self.model_dir).metrics
        if step >= self.train_steps:
            done = (read_json(metrics_path, "metrics", METRICS_FIELDS)
                    if tf.io.gfile.exists(metrics_path)
                    else {"step": step})
            return {**done, "nothing_to_do": True}
        self.train_step.train_loop_begin()  # the train input at `step`: its shards' CRCs are read
        compiled_ahead = self._compile_first_loop(save_every, eval_every, check_compiled, log)
        for message in self.run_record.messages:
            log(message)
        if lease is not None:
            lease.acquire()
        try:
            return self._train(restored, lease, save_every, eval_every, max_eval_batches, log,
                               compiled_ahead)
        finally:
            # The input's tf.data threads end now, not whenever Python's cycle collector reaches
            # the train step: a collection during a later trace under a MirroredStrategy would
            # wait there for them to end. The next train() rebuilds it at its step.
            self.train_step.rewind_input()
            if lease is not None:
                lease.release()

    def _controller(self, save_every, eval_every, **actions):
        return Controller(
            self.train_step, self.checkpoint, train_steps=self.train_steps,
            steps_per_loop=self.steps_per_loop, save_every=save_every, eval_every=eval_every,
            short_first_loops=self.options.short_first_loops,
            each_length_compiles=self.backend.each_loop_length_compiles, **actions)

    def _compile_first_loop(self, save_every, eval_every, check_compiled, log):
        """Compiles the first host loop where the backend does so before running it, and gives
        `check_compiled` its peak bytes; whether it was compiled."""
        if check_compiled is None or not self.train_step.compiles_ahead:
            return False
        first = self._controller(save_every, eval_every).first_loop_steps()
        log(f"step {self.train_step.step}: compiling the train step (a host loop of {first} "
            f"step{'s' * (first > 1)})")
        started = time.perf_counter()
        peak = self.train_step.compile_loop(first)
        log(f"compiled in {time.perf_counter() - started:.1f} s")
        if peak is not None:
            check_compiled(peak)
        return True

    def _train(self, restored, lease, save_every, eval_every, max_eval_batches, log,
               compiled_ahead=False):
        """Train's second half: every check has passed and the lease is held."""
        step = self.train_step.step
        layout = ModelDir(self.model_dir)
        if self.is_chief:  # every check has passed: only now is the model_dir claimed
            self.task.claim_model_dir(self.model_dir, self.data)
            self.run_record.store(step)
        self.checkpoint.prepare_to_save(log)
        if restored:
            log(f"resumed from {restored} at step {step}")

        metrics = {"start_step": step}
        if self.init_checkpoint:
            metrics["init_checkpoint"] = self.init_checkpoint
        metric, shown = self.metric, self.task.eval_scalars(self.data)

        def record_and_log(at_step, result):
            if self.is_chief:  # every worker evaluates; one says so
                log(f"step {at_step}: valid " + ", ".join(f"{name} {result[name]:.4f}"
                                                          for name in shown))
            metrics["valid"] = result

        units_per_step = self.task.units_per_step(self.global_batch)
        train_actions, eval_actions, tensorboard, train_log = [], [record_and_log], None, None
        before_save, after_save = [], []  # hooks around every checkpoint save
        if self.is_chief:
            resume_train_log(self.model_dir, step, log)  # the log continues at `step`
            train_log = TrainLog(self.model_dir, self.options.train_log_seconds)
            tensorboard = TensorBoardScalars(layout.tensorboard, metric, units_per_step,
                                             self.task.unit, shown)
            # A trainer whose lease was taken over stops before it writes anything more.
            train_actions += [lease.ensure_held, tensorboard, train_log]
            eval_actions.insert(0, tensorboard.eval_action)
            before_save += [lease.ensure_held, train_log.flush]
            after_save += [train_log.merge]
        self.checkpoint.before_save += before_save
        self.checkpoint.after_save += after_save
        progress = run_progress(self.train_steps, step, metric, units_per_step,
                                verbose=1 if self.is_chief else 0, unit=self.task.unit)
        train_actions.append(progress)
        stops = StopRequests(self.backend)
        controller = self._controller(
            save_every, eval_every,
            evaluate=lambda: self.evaluate("valid", max_batches=max_eval_batches),
            train_actions=train_actions, eval_actions=eval_actions, stop_requested=stops.agreed)
        if step < self.train_steps:
            # Unless compiled ahead, the first call compiles (traces) the step before it runs: on
            # a large model minutes pass before the first progress line, which say what is on.
            first = controller.first_loop_steps()
            what = "" if compiled_ahead else "compiling the train step, then "
            log(f"step {step}: {what}running the first host loop ({first} "
                f"step{'s' * (first > 1)})")
        started = time.perf_counter()
        try:
            with stops.signals:  # SIGTERM/SIGINT: checkpoint and stop at a host loop's end
                last = controller.train()
        except TrainingStopped:
            progress.end()  # the line that says where to resume starts on a line of its own
            raise
        except TrainingDiverged as err:
            raise TrainingDiverged(f"{err}; training stopped, the last good checkpoint in "
                                   f"{self.model_dir}/checkpoints is kept") from None
        finally:
            for hooks, ours in ((self.checkpoint.before_save, before_save),
                                (self.checkpoint.after_save, after_save)):
                hooks[:] = [hook for hook in hooks if hook not in ours]
            if tensorboard:
                tensorboard.close()
            if train_log and not lease.lost:  # the steps done so far, also when failing
                train_log.close()
        trained = self.train_step.step - step
        metrics.update(step=self.train_step.step, train_loss=float(last["loss"][-1]),
                       **{f"train_{self.task.unit}_per_second": trained * units_per_step
                          / (time.perf_counter() - started)})
        if self.is_chief:
            self.task.publish_results(self.model, self.model_dir, metrics)
            write_json_atomically(layout.metrics, metrics)  # last: the run is finished
        return metrics
