"""The trainer: optimizer, training memory, the per-replica train step and its host loop.

In the manner of Orbit's StandardTrainer: `train(num_steps)` runs `train_loop_begin`, then
`num_steps` replica steps inside one `tf.function` (the TPU Estimator's iterations_per_loop), then
`train_loop_end`. The cadence (checkpoints, evaluation, logs) is the controller's.

Shape glossary: B global batch, b per-replica batch, T segment length, R replicas.
"""

import keras
import numpy as np
import tensorflow as tf

from tfxl.train.memory_state import CheckpointedReplicaMemory
from tfxl.train.optimization import OptimizerParams, make_optimizer


class TrainingDiverged(RuntimeError):
    """A non-finite loss; the message names the step. The last good checkpoint is kept."""


class Trainer:
    """Trains `model` (built under `strategy`) on the train split of `data`.

    Args:
      model: a built `TransfoXLLM` (another model: a subclass defines `make_memory`, `weight`
        and `loss_fn`). strategy: its strategy.
      data: a `tfxl.train.datasets.DistributedData` (or what has its `dataset` method).
      global_batch: B, divisible by the number of replicas.
      opt: the optimizer and schedule. mixed_precision: the Keras dtype policy name.
      jit_compile: XLA-compile each replica's forward and backward pass.
    """

    def __init__(self, model, strategy, data, global_batch, opt: OptimizerParams,
                 mixed_precision="float32", jit_compile=False):
        if global_batch % strategy.num_replicas_in_sync:
            raise ValueError(f"--train_batch_size={global_batch} is not divisible by the "
                             f"{strategy.num_replicas_in_sync} replicas")
        self.model, self.strategy, self.data = model, strategy, data
        self.global_batch = global_batch
        self.per_replica_batch = global_batch // strategy.num_replicas_in_sync
        self.clip = opt.clip
        with strategy.scope():
            self.optimizer, self.schedule = make_optimizer(opt, mixed_precision)
            self.optimizer.build(model.trainable_variables)
        self.loss_scaled = isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)
        self.memory = self.make_memory()
        self._forward_backward = (tf.function(self._forward_backward_fn, jit_compile=True)
                                  if jit_compile else self._forward_backward_fn)
        self._iterator = None
        self._loop = tf.function(self._loop_fn)

    # -- what a model's training defines (a language model's here; subclasses, e.g.
    #    train/classification.py's, define their own) --------------------------------------------
    def make_memory(self):
        """The state carried from step to step on every replica and checkpointed with the model
        (a `CheckpointedReplicaMemory`), or None for none: the language model's memory."""
        return CheckpointedReplicaMemory(
            self.strategy, self.model.init_memory(self.per_replica_batch), "train_memory")

    def weight(self, features):
        """What this replica's rows count for in the global mean loss: its real targets."""
        return tf.reduce_sum(tf.cast(features["target_mask"], tf.float32))

    def loss_fn(self, features, memory, global_weight):
        """(this replica's share of the global mean loss, the new memory), in training mode."""
        nll, new_memory = self.model(features["inputs"], memory, reset=features["reset"],
                                     targets=features["targets"], training=True)
        mask = tf.cast(features["target_mask"], nll.dtype)
        # This replica's share of the global token-weighted mean (padding excluded): summing
        # over replicas gives the mean over every real target of the global batch.
        return tf.reduce_sum(nll * mask) / global_weight, new_memory

    @property
    def step(self):
        return int(self.optimizer.iterations.numpy())

    def rewind_input(self):
        """The next loop rebuilds the input at the current step (after a restore).

        Distributed tf.data iterators cannot be checkpointed under Mirrored/MultiWorker/TPU
        strategies, so the input position is the step: the pipeline is deterministic and is
        rebuilt skipping the `step` batches already consumed (one path for every strategy).
        """
        self._iterator = None

    # -- host ---------------------------------------------------------------------------------
    def train(self, num_steps):
        """Runs `num_steps` steps; returns {"loss", "grad_norm", "learning_rate"} per step."""
        self.train_loop_begin()
        first_step = self.step
        losses, norms = self._loop(self._iterator, tf.constant(num_steps))
        return self.train_loop_end(first_step, losses.numpy(), norms.numpy())

    def train_loop_begin(self):
        if self._iterator is None:
            self._iterator = iter(self.data.dataset("train", self.global_batch, True,
                                                    skip_batches=self.step))

    def train_loop_end(self, first_step, losses, norms):
        bad = np.flatnonzero(~np.isfinite(losses))
        if bad.size:
            raise TrainingDiverged(f"non-finite loss {losses[bad[0]]} at step "
                                   f"{first_step + bad[0] + 1}")
        learning_rates = np.array([float(self.schedule(first_step + i))
                                   for i in range(len(losses))])
        return {"loss": losses, "grad_norm": norms, "learning_rate": learning_rates}

    def _loop_fn(self, iterator, steps):
        losses = tf.TensorArray(tf.float32, size=steps)
        norms = tf.TensorArray(tf.float32, size=steps)
        for i in tf.range(steps):
            loss, norm = self.strategy.run(self.train_step, args=(next(iterator),))
            losses = losses.write(i, self.strategy.experimental_local_results(loss)[0])
            norms = norms.write(i, self.strategy.experimental_local_results(norm)[0])
        return losses.stack(), norms.stack()

    # -- replica ------------------------------------------------------------------------------
    def _forward_backward_fn(self, features, memory, global_weight):
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            loss, new_memory = self.loss_fn(features, memory, global_weight)
            scaled = self.optimizer.scale_loss(loss) if self.loss_scaled else loss
        grads = tape.gradient(scaled, variables)
        return loss, [tf.convert_to_tensor(g) for g in grads], new_memory

    def train_step(self, features):
        """One optimisation step on this replica's rows; returns the global (loss, grad norm).

        The gradients cross the replicas once: summed here, clipped by the norm of the sum, and
        applied by an optimizer that does not sum them again (train/optimization.py).
        """
        context = tf.distribute.get_replica_context()
        weight = self.weight(features)
        global_weight = tf.maximum(context.all_reduce(tf.distribute.ReduceOp.SUM, weight), 1.0)
        memory = self.memory.read() if self.memory is not None else None
        loss, grads, new_memory = self._forward_backward(features, memory, global_weight)
        grads = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        if self.loss_scaled:
            scale = tf.cast(self.optimizer.dynamic_scale, tf.float32)
            grads = [g / scale for g in grads]
        grads, grad_norm = tf.clip_by_global_norm(grads, self.clip)
        if self.loss_scaled:
            grads = [g * scale for g in grads]  # the LossScaleOptimizer unscales (and skips inf)
        self.optimizer.apply(grads, self.model.trainable_variables)
        if self.memory is not None:
            self.memory.write(new_memory)
        return context.all_reduce(tf.distribute.ReduceOp.SUM, loss), grad_norm
