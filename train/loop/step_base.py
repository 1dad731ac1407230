"""What the train steps of both backends share (train/loop/train_step.py's `TrainStep` on
TensorFlow, train/loop/jax_train_step.py's `JaxTrainStep` on JAX): the batch check, the optimizer,
the input
iterator and its rewind (`TrainStepBase`), and the end of a host loop: the per-step losses,
gradient norms and learning rates a loop returns, and `TrainingDiverged` at a non-finite loss.

Imports no TensorFlow: the JAX step runs where TensorFlow is not installed.
"""

import keras
import numpy as np

from tfxl.train.loop.optimization import OptimizerParams, make_optimizer


class TrainingDiverged(RuntimeError):
    """A non-finite loss; the message names the step. The last good checkpoint is kept."""


class TrainStepBase:
    """Trains `model` on the train split of `data` with `task`'s loss; a backend's step adds
    `step`, `train(num_steps)` and `memory`.

    Args:
      task: the `Task` whose `initial_memory`, `batch_weight` and `loss` a step computes.
      model: the task's model, built under `strategy`.
      strategy: the backend's distribution (its `num_replicas_in_sync` split the batch).
      data: what has the `dataset(split, batch, training, skip_batches)` method (the task's
        `load_data`), or None when the caller feeds the step itself.
      global_batch: B, divisible by `strategy.num_replicas_in_sync`.
      optimizer: the optimizer and its schedule. mixed_precision: the Keras dtype policy name.
    """

    # What the batch is split over, for the divisibility error.
    replicas = "replicas"

    def __init__(self, task, model, *, strategy, data, global_batch: int,
                 optimizer: OptimizerParams, mixed_precision: str = "float32"):
        if global_batch % strategy.num_replicas_in_sync:
            raise ValueError(f"--train_batch_size={global_batch} is not divisible by the "
                             f"{strategy.num_replicas_in_sync} {self.replicas}")
        self.check_precision(mixed_precision)
        self.task, self.model, self.strategy, self.data = task, model, strategy, data
        self.global_batch, self.clip = global_batch, optimizer.clip
        with strategy.scope():
            self.optimizer, self.schedule = make_optimizer(optimizer, mixed_precision)
            self.optimizer.build(model.trainable_variables)
        self._iterator = None

    @staticmethod
    def check_precision(mixed_precision):
        """ValueError for a dtype policy this backend's step does not train with."""

    def rewind_input(self):
        """The next loop rebuilds the input at the current step (after a restore).

        Distributed tf.data iterators cannot be checkpointed under Mirrored/MultiWorker/TPU
        strategies, so the input position is the step: the pipeline is deterministic and is
        rebuilt skipping the `step` batches already consumed (one path for every backend and
        strategy).
        """
        self._iterator = None

    def train_loop_begin(self):
        if self._iterator is None:
            dataset = self.data.dataset("train", self.global_batch, True, skip_batches=self.step)
            self._iterator = self.iterate(dataset)

    # Whether `compile_loop` compiles a host loop before its first call (JAX's ahead-of-time
    # `lower(...).compile()`); TensorFlow's tf.function compiles when it is called.
    compiles_ahead = False

    def compile_loop(self, num_steps):
        """Compiles the host loop of `num_steps` steps before its first call and returns the
        bytes its compiler says it holds at its peak on one device, or None where it says
        nothing (or, without `compiles_ahead`, compiles nothing before the call)."""
        del num_steps
        return None

    @staticmethod
    def iterate(dataset):
        """The iterator over the train split a host loop reads from."""
        return iter(dataset)

    def train_loop_end(self, first_step, losses, norms):
        return loop_outputs(self.schedule, first_step, losses, norms)


def loop_outputs(schedule, first_step, losses, norms):
    """A host loop's outputs from its per-step losses and gradient norms (numpy), with the
    schedule's rate at each step (what the train log and TensorBoard record);
    TrainingDiverged names the first step whose loss is not finite."""
    bad = np.flatnonzero(~np.isfinite(losses))
    if bad.size:
        raise TrainingDiverged(f"non-finite loss {losses[bad[0]]} at step "
                               f"{first_step + bad[0] + 1}")
    rates = np.array([float(keras.ops.convert_to_numpy(schedule(first_step + i)))
                      for i in range(len(losses))])
    return {"loss": losses, "grad_norm": norms, "learning_rate": rates}
