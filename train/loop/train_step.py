"""The train step: a task's loss compiled into one optimisation step, with the optimizer and the
training memory it updates, and the host loop that runs it.

In the manner of Orbit's StandardTrainer: `train(num_steps)` runs `train_loop_begin`, then
`num_steps` replica steps (`replica_step`) inside one `tf.function` (the TPU Estimator's
iterations_per_loop), then `train_loop_end`. What a step computes is the task's
(train/tasks/task.py: `initial_memory`, `batch_weight`, `loss`); the cadence (checkpoints,
evaluation, logs) is the controller's (train/loop/controller.py).

Shape glossary: B global batch, b per-replica batch, T segment length, R replicas.
"""

import keras
import tensorflow as tf

from tfxl.train.loop.step_base import TrainStepBase
from tfxl.train.loop.optimization import OptimizerParams, clip_by_global_norm
from tfxl.train.tasks.task import Task


class TrainStep(TrainStepBase):
    """Trains `model` (built under `strategy`) on the train split of `data` with `task`'s loss.

    Args:
      task, model, data, global_batch, optimizer, mixed_precision: as `TrainStepBase`'s
        (train/loop/step_base.py); data None when the caller feeds `replica_step` itself.
      strategy: a `tf.distribute` strategy; the batch is split over its replicas.
      memory: the training memory (`TensorFlowBackend.training_memory` of the task's
        `initial_memory` for one replica's rows), or None for a task without one.
      jit_compile: XLA-compile each replica's forward and backward pass.
    """

    def __init__(self, task: Task, model, *, strategy, data, global_batch: int,
                 optimizer: OptimizerParams, memory, mixed_precision: str = "float32",
                 jit_compile: bool = False):
        super().__init__(task, model, strategy=strategy, data=data, global_batch=global_batch,
                         optimizer=optimizer, mixed_precision=mixed_precision)
        self.per_replica_batch = global_batch // strategy.num_replicas_in_sync
        self.loss_scaled = isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)
        self.memory = memory
        self._forward_backward = (tf.function(self._forward_backward_fn, jit_compile=True)
                                  if jit_compile else self._forward_backward_fn)
        self._loop = tf.function(self._loop_fn)

    @property
    def step(self):
        return int(self.optimizer.iterations.numpy())

    # -- host ---------------------------------------------------------------------------------
    def train(self, num_steps):
        """Runs `num_steps` steps; returns {"loss", "grad_norm", "learning_rate"} per step."""
        self.train_loop_begin()
        first_step = self.step
        losses, norms = self._loop(self._iterator, tf.constant(num_steps))
        return self.train_loop_end(first_step, losses.numpy(), norms.numpy())

    def _loop_fn(self, iterator, steps):
        losses = tf.TensorArray(tf.float32, size=steps)
        norms = tf.TensorArray(tf.float32, size=steps)
        for i in tf.range(steps):
            loss, norm = self.strategy.run(self.replica_step, args=(next(iterator),))
            losses = losses.write(i, self.strategy.experimental_local_results(loss)[0])
            norms = norms.write(i, self.strategy.experimental_local_results(norm)[0])
        return losses.stack(), norms.stack()

    # -- replica ------------------------------------------------------------------------------
    def _forward_backward_fn(self, features, memory, global_weight):
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            loss, new_memory = self.task.loss(self.model, features, memory, global_weight)
            scaled = self.optimizer.scale_loss(loss) if self.loss_scaled else loss
        grads = tape.gradient(scaled, variables)
        return loss, [tf.convert_to_tensor(g) for g in grads], new_memory

    def replica_step(self, features):
        """One optimisation step on this replica's rows; returns the global (loss, grad norm).

        The gradients cross the replicas once: summed here, clipped by the norm of the sum, and
        applied by an optimizer that does not sum them again (train/loop/optimization.py).
        """
        context = tf.distribute.get_replica_context()
        weight = self.task.batch_weight(features)
        global_weight = tf.maximum(context.all_reduce(tf.distribute.ReduceOp.SUM, weight), 1.0)
        memory = self.memory.read() if self.memory is not None else None
        loss, grads, new_memory = self._forward_backward(features, memory, global_weight)
        grads = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        if self.loss_scaled:
            scale = tf.cast(self.optimizer.dynamic_scale, tf.float32)
            grads = [g / scale for g in grads]
        grads, grad_norm = clip_by_global_norm(grads, self.clip)
        if self.loss_scaled:
            grads = [g * scale for g in grads]  # the LossScaleOptimizer unscales (and skips inf)
        self.optimizer.apply(grads, self.model.trainable_variables)
        if self.memory is not None:
            self.memory.write(new_memory)
        return context.all_reduce(tf.distribute.ReduceOp.SUM, loss), grad_norm
