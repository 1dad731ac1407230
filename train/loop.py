"""The jobs tfxl-train and tfxl-eval run, composed from the trainer's parts (and the frame of
tfxl-classify-train's, train/classification.py).

`TrainingRun` is what every training job does around its trainer (checks, lease, records,
resume, the controller and its sinks, signals); `Runner` (tfxl-train, make demo), the language
model's job, composes the input (train/datasets.py), the model, the trainer
(train/trainer.py: optimizer, training memory, train step), the evaluator (train/evaluator.py),
the training checkpoint (train/checkpointing.py), the model_dir's records (tfxl/model_dir.py) and
the controller with its log sinks (train/controller.py). `make_evaluator` (tfxl-eval) builds only
the model and the evaluator: no optimizer, no training memory.

Memory lives on the replicas across host loops (train/memory_state.py) and is checkpointed with the
model, optimizer, step and dropout seeds, so a resumed run continues exactly where the last
checkpoint stopped.
"""

import dataclasses
import sys
import time

import keras
import tensorflow as tf

from tfxl.checkpoints import checkpoints_newest_first
from tfxl.cli.quiet import stream_is_terminal
from tfxl.config import TransfoXLConfig
from tfxl.data.manifest import check_manifest, load_manifest
from tfxl.files import read_json, write_json_atomically
from tfxl.model_dir import ModelDir, check_data_fingerprint, check_or_store_config, claim
from tfxl.models import TransfoXLLM
from tfxl.train.checkpointing import TrainingCheckpoint
from tfxl.train.controller import Controller, ProgressBar, ProgressLines, TensorBoardScalars
from tfxl.train.datasets import DistributedData
from tfxl.train.evaluator import EvalProgress, Evaluator
from tfxl.train.preemption import StopRequests, TrainingStopped
from tfxl.train.lease import Lease, LeaseParams
from tfxl.train.run_record import RunRecord, run_settings
from tfxl.train.train_log import FLUSH_SECONDS, TrainLog, resume_train_log
from tfxl.train.trainer import Trainer, TrainingDiverged

__all__ = ["Runner", "TrainingDiverged", "TrainingRun", "TrainingStopped", "build_model",
           "make_evaluator"]


def build_model(config: TransfoXLConfig, strategy):
    """The language model, its weights created under `strategy`."""
    with strategy.scope():
        model = TransfoXLLM(config, name="transfo_xl_lm")
        model.build((None, config.tgt_len))
    return model


def _data(config, strategy, data_dir, model_dir, mixed_precision, seed):
    """The checked data of a job; sets the dtype policy and the seeds (same initial weights and
    dropout stream every run)."""
    manifest = load_manifest(data_dir)
    check_manifest(manifest, tgt_len=config.tgt_len, vocab_size=config.vocab_size)
    check_data_fingerprint(model_dir, manifest, data_dir)
    keras.config.set_dtype_policy(mixed_precision)
    keras.utils.set_random_seed(seed)
    return DistributedData(strategy, data_dir, manifest, seed)


def make_evaluator(config, strategy, data_dir, model_dir, global_batch,
                   mixed_precision="float32", jit_compile=False, steps_per_loop=100,
                   progress=None):
    """tfxl-eval's evaluator: the model (weights not restored yet: `restore_weights`) and the
    evaluation state only. progress: show a progress bar (None: when stderr is a terminal)."""
    data = _data(config, strategy, data_dir, model_dir, mixed_precision, seed=0)
    return Evaluator(build_model(config, strategy), strategy, data, global_batch,
                     steps_per_loop, jit_compile, EvalProgress(progress))


def train_from_command_line(run, train_steps, *args, **kwargs):
    """`run.train(*args, **kwargs)` for a training tool's main. Returns (metrics, None) when it
    trained, or (None, exit status) when there was nothing more to do or a signal stopped it
    (saved; 143/130, BUILD.md), each said on stdout."""
    try:
        metrics = run.train(*args, **kwargs)
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
    """What every training job does around its trainer: the checks before anything is written,
    the lease, the model_dir's records, resuming (checkpoint, train log), the controller with
    its log sinks, SIGTERM/SIGINT, metrics.json (`train`).

    A subclass builds, in its constructor: `config` (the model's `TransfoXLConfig`, config.json),
    `strategy`, `model_dir`, `data`, `model`, `trainer` (train/trainer.py), `checkpoint`
    (`TrainingCheckpoint`), `run_record`, `global_batch`, `steps_per_loop`, `train_steps`,
    `is_chief`, `lease_params`, `train_log_seconds`, `init_checkpoint`; and says in the hooks
    below what differs between models (a language model's: `Runner`; the document
    classifier's: train/classification.py).
    """

    metric = None     # a metric of the training loss shown beside it (bpc, ppl), or None
    unit = "tokens"   # what the throughput counts

    def units_per_step(self):
        return self.global_batch * self.config.tgt_len

    def check_data(self, eval_every):
        """Refuses data that cannot train (or evaluate, with eval_every), before anything is
        written: a ValueError (DataError) naming what is wrong."""
        raise NotImplementedError

    def claim_model_dir(self):
        """Writes (or checks) the model_dir's records of the model and data: every check has
        passed."""
        raise NotImplementedError

    def evaluate_in_run(self, max_eval_batches):
        """The valid split's evaluation every eval_every steps: a dict of results."""
        raise NotImplementedError

    def eval_scalars(self):
        """The names in `evaluate_in_run`'s result that are logged and sent to TensorBoard."""
        return (self.metric,)

    def publish_results(self, metrics):
        """What the chief writes once training has reached train_steps, before metrics.json
        (None: the checkpoints are the result); may add to `metrics`."""

    def restore(self, log=print):
        """Restores the newest readable checkpoint (see TrainingCheckpoint); the input then
        continues at the restored step."""
        restored = self.checkpoint.restore(log)
        self.trainer.rewind_input()
        return restored

    def train(self, save_every=None, eval_every=None, max_eval_batches=None, log=print):
        """Trains to `train_steps`; returns the final metrics dict (also in metrics.json).

        A model_dir already at `train_steps` has nothing to train: its metrics.json (the results of
        the run that did the work) is kept and returned with "nothing_to_do": True added.

        SIGTERM or SIGINT (in the main thread) stops the run at the end of the host loop in flight,
        on every worker at the same step: that step's checkpoint is saved and `TrainingStopped`
        raised (its text says where to resume); no metrics.json is written (train/preemption.py).

        Every check that can refuse the run comes before anything is written into the model_dir:
        the data (manifest, shard sizes, evaluation shards' CRCs), the model (config.json), the
        run's settings (run.json, in the constructor), another live trainer (lease.json), the
        checkpoint (restored: it must fit) and the train input (built at the restored step, which
        reads its shards' CRCs). Then the lease is taken and the model_dir claimed.
        """
        self.check_data(eval_every)
        lease = Lease(self.model_dir, self.lease_params, log) if self.is_chief else None
        if self.is_chief:
            check_or_store_config(self.model_dir, self.config, store=False)
            lease.check()
        restored = self.restore(log)
        step = self.trainer.step
        metrics_path = ModelDir(self.model_dir).metrics
        if step >= self.train_steps:
            done = (read_json(metrics_path, "metrics") if tf.io.gfile.exists(metrics_path)
                    else {"step": step})
            return {**done, "nothing_to_do": True}
        self.trainer.train_loop_begin()  # the train input at `step`: its shards' CRCs are read
        for message in self.run_record.messages:
            log(message)
        if lease is not None:
            lease.acquire()
        try:
            return self._train(restored, lease, save_every, eval_every, max_eval_batches, log)
        finally:
            # The input's tf.data threads end now, not whenever Python's cycle collector reaches
            # the trainer: a collection during a later trace under a MirroredStrategy waited
            # 14-38 s on them (BUILD.md, "Tests"). The next train() rebuilds it at its step.
            self.trainer.rewind_input()
            if lease is not None:
                lease.release()

    def _train(self, restored, lease, save_every, eval_every, max_eval_batches, log):
        """Train's second half: every check has passed and the lease is held."""
        step = self.trainer.step
        layout = ModelDir(self.model_dir)
        if self.is_chief:  # every check has passed: only now is the model_dir claimed
            self.claim_model_dir()
            self.run_record.store(step)
        self.checkpoint.prepare_to_save(log)
        if restored:
            log(f"resumed from {restored} at step {step}")

        metrics = {"start_step": step}
        if self.init_checkpoint:
            metrics["init_checkpoint"] = self.init_checkpoint
        metric, shown = self.metric, self.eval_scalars()

        def record_and_log(at_step, result):
            log(f"step {at_step}: valid " + ", ".join(f"{name} {result[name]:.4f}"
                                                      for name in shown))
            metrics["valid"] = result

        units_per_step = self.units_per_step()
        train_actions, eval_actions, tensorboard, train_log = [], [record_and_log], None, None
        before_save, after_save = [], []  # hooks around every checkpoint save
        if self.is_chief:
            resume_train_log(self.model_dir, step, log)  # the log continues at `step`
            train_log = TrainLog(self.model_dir, self.train_log_seconds)
            tensorboard = TensorBoardScalars(layout.tensorboard, metric, units_per_step,
                                             self.unit, shown)
            # A trainer whose lease was taken over stops before it writes anything more.
            train_actions += [lease.ensure_held, tensorboard, train_log]
            eval_actions.insert(0, tensorboard.eval_action)
            before_save += [lease.ensure_held, train_log.flush]
            after_save += [train_log.merge]
        self.checkpoint.before_save += before_save
        self.checkpoint.after_save += after_save
        progress = run_progress(self.train_steps, step, metric, units_per_step,
                                verbose=1 if self.is_chief else 0, unit=self.unit)
        train_actions.append(progress)
        stops = StopRequests(self.strategy)
        controller = Controller(
            self.trainer, self.checkpoint, self.train_steps, self.steps_per_loop, save_every,
            eval_every, lambda: self.evaluate_in_run(max_eval_batches),
            train_actions, eval_actions, stop_requested=stops.agreed)
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
        trained = self.trainer.step - step
        metrics.update(step=self.trainer.step, train_loss=float(last["loss"][-1]),
                       **{f"train_{self.unit}_per_second": trained * units_per_step
                          / (time.perf_counter() - started)})
        if self.is_chief:
            self.publish_results(metrics)
            write_json_atomically(layout.metrics, metrics)  # last: the run is finished
        return metrics


class Runner(TrainingRun):
    """One training job (tfxl-train, make demo): trains, checkpoints and evaluates a model."""

    def __init__(self, config, strategy, data_dir, model_dir, global_batch, opt_params,
                 mixed_precision="float32", jit_compile=False, steps_per_loop=100, seed=0,
                 is_chief=True, allow_run_changes=False, lease=None,
                 train_log_seconds=FLUSH_SECONDS):
        """allow_run_changes: continue a checkpoint with settings other than run.json's
        (train/run_record.py). lease: the model_dir lease's `LeaseParams` (train/lease.py).
        train_log_seconds: how often the train log writes its new lines (train/train_log.py)."""
        self.config, self.strategy, self.model_dir = config, strategy, model_dir
        self.data = _data(config, strategy, data_dir, model_dir, mixed_precision, seed)
        self.global_batch, self.steps_per_loop = global_batch, steps_per_loop
        self.train_steps, self.is_chief = opt_params.train_steps, is_chief
        self.lease_params = lease or LeaseParams()
        self.train_log_seconds = train_log_seconds
        # The run's recorded settings (run.json) decide the schedule's length; reads only.
        self.run_record = RunRecord.resolve(
            model_dir, run_settings(opt_params, global_batch, mixed_precision, seed,
                                    steps_per_loop, strategy),
            opt_params.train_steps, resuming=bool(checkpoints_newest_first(
                ModelDir(model_dir).checkpoints)), allow_changes=allow_run_changes)
        opt_params = dataclasses.replace(opt_params,
                                         schedule_steps=self.run_record.schedule_steps)
        self.init_checkpoint = None  # the weights a new run started from (train/warm_start.py)
        self.model = build_model(config, strategy)
        self.trainer = Trainer(self.model, strategy, self.data, global_batch, opt_params,
                               mixed_precision, jit_compile)
        # Evaluations inside a run are quiet: the run's own progress bar is on screen.
        self.evaluator = Evaluator(self.model, strategy, self.data, global_batch,
                                   steps_per_loop, jit_compile)
        self.checkpoint = TrainingCheckpoint(
            self.model, self.trainer.optimizer, self.trainer.memory, model_dir,
            worker_id=None if is_chief else strategy.cluster_resolver.task_id)

    @property
    def metric(self):
        return self.evaluator.metric

    def evaluate(self, split="valid", **settings):
        """`Evaluator.evaluate` with the current weights."""
        return self.evaluator.evaluate(split, **settings)

    def check_data(self, eval_every):
        # Training slots own whole streams: the global batch must divide the stream count.
        check_manifest(self.data.manifest, global_batch_size=self.global_batch)
        # A corrupt valid shard must not surface only at the first evaluation, hours in.
        self.data.check_splits("train", *(["valid"] if eval_every else []))

    def claim_model_dir(self):
        claim(self.model_dir, self.config, self.data.manifest, self.data.data_dir)

    def evaluate_in_run(self, max_eval_batches):
        return self.evaluate("valid", max_batches=max_eval_batches)
