"""The jobs tfxl-train and tfxl-eval run, composed from the trainer's parts.

`Runner` (tfxl-train, make demo) composes the input (train/datasets.py), the model, the trainer
(train/trainer.py: optimizer, training memory, train step), the evaluator (train/evaluator.py),
the training checkpoint (train/checkpointing.py), the model_dir's records (tfxl/model_dir.py) and
the controller with its log sinks (train/controller.py). `make_evaluator` (tfxl-eval) builds only
the model and the evaluator: no optimizer, no training memory.

Memory lives on the replicas across host loops (train/memory_state.py) and is checkpointed with the
model, optimizer, step and dropout seeds, so a resumed run continues exactly where the last
checkpoint stopped.
"""

import time

import keras
import tensorflow as tf

from tfxl.config import TransfoXLConfig
from tfxl.data.manifest import check_manifest, load_manifest
from tfxl.files import read_json, write_json_atomically
from tfxl.model_dir import ModelDir, check_data_fingerprint, claim
from tfxl.models import TransfoXLLM
from tfxl.train.checkpointing import TrainingCheckpoint
from tfxl.train.controller import Controller, ProgressBar, TensorBoardScalars, TrainLog
from tfxl.train.datasets import DistributedData
from tfxl.train.evaluator import EvalProgress, Evaluator
from tfxl.train.trainer import Trainer, TrainingDiverged

__all__ = ["Runner", "TrainingDiverged", "build_model", "make_evaluator"]


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


class Runner:
    """One training job (tfxl-train, make demo): trains, checkpoints and evaluates a model."""

    def __init__(self, config, strategy, data_dir, model_dir, global_batch, opt_params,
                 mixed_precision="float32", jit_compile=False, steps_per_loop=100, seed=0,
                 is_chief=True):
        self.config, self.strategy, self.model_dir = config, strategy, model_dir
        self.data = _data(config, strategy, data_dir, model_dir, mixed_precision, seed)
        self.global_batch, self.steps_per_loop = global_batch, steps_per_loop
        self.train_steps, self.is_chief = opt_params.train_steps, is_chief
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

    def restore(self, log=print):
        """Restores the newest readable checkpoint (see TrainingCheckpoint); the input then
        continues at the restored step."""
        restored = self.checkpoint.restore(log)
        self.trainer.rewind_input()
        return restored

    def evaluate(self, split="valid", **settings):
        """`Evaluator.evaluate` with the current weights."""
        return self.evaluator.evaluate(split, **settings)

    def train(self, save_every=None, eval_every=None, max_eval_batches=None, log=print):
        """Trains to `train_steps`; returns the final metrics dict (also in metrics.json).

        A model_dir already at `train_steps` has nothing to train: its metrics.json (the results of
        the run that did the work) is kept and returned with "nothing_to_do": True added.
        """
        # Training slots own whole streams: the global batch must divide the stream count.
        check_manifest(self.data.manifest, global_batch_size=self.global_batch)
        # A corrupt valid shard must not surface only at the first evaluation, hours in.
        self.data.check_splits("train", *(["valid"] if eval_every else []))
        if self.is_chief:  # every check has passed: only now is the model_dir claimed
            claim(self.model_dir, self.config, self.data.manifest, self.data.data_dir)
        restored = self.restore(log)
        step = self.trainer.step
        metric = self.evaluator.metric
        layout = ModelDir(self.model_dir)
        log_path, metrics_path = layout.train_log, layout.metrics
        if step >= self.train_steps:
            done = (read_json(metrics_path, "metrics") if tf.io.gfile.exists(metrics_path)
                    else {"step": step})
            return {**done, "nothing_to_do": True}
        if restored:
            log(f"resumed from {restored} at step {step}")
            if self.is_chief:
                TrainLog.truncate(log_path, step)

        metrics = {"start_step": step}
        if self.init_checkpoint:
            metrics["init_checkpoint"] = self.init_checkpoint

        def record_and_log(at_step, result):
            log(f"step {at_step}: valid {metric} {result[metric]:.4f}")
            metrics["valid"] = result

        tokens_per_step = self.global_batch * self.config.tgt_len
        train_actions, eval_actions, tensorboard = [], [record_and_log], None
        if self.is_chief:
            tensorboard = TensorBoardScalars(layout.tensorboard, metric,
                                             tokens_per_step)
            train_actions += [tensorboard, TrainLog(log_path)]
            eval_actions.insert(0, tensorboard.eval_action)
        train_actions.append(ProgressBar(self.train_steps, step, metric,
                                         verbose=1 if self.is_chief else 0))
        controller = Controller(
            self.trainer, self.checkpoint, self.train_steps, self.steps_per_loop, save_every,
            eval_every, lambda: self.evaluate("valid", max_batches=max_eval_batches),
            train_actions, eval_actions)
        started = time.perf_counter()
        try:
            last = controller.train()
        except TrainingDiverged as err:
            raise TrainingDiverged(f"{err}; training stopped, the last good checkpoint in "
                                   f"{self.model_dir}/checkpoints is kept") from None
        finally:
            if tensorboard:
                tensorboard.close()
        trained = self.trainer.step - step
        metrics.update(step=self.trainer.step, train_loss=float(last["loss"][-1]),
                       train_tokens_per_second=trained * tokens_per_step
                       / (time.perf_counter() - started))
        if self.is_chief:
            write_json_atomically(metrics_path, metrics)
        return metrics
