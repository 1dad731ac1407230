"""The train step on JAX: a task's loss as one pure function of the run's state, compiled with
`jax.jit`, `steps_per_loop` steps per call (a `lax.scan`: the TPU Estimator's host loop, as
train/loop/train_step.py's `TrainStep` is on TensorFlow).

The state is every array a step reads and writes: the trainable and non-trainable weights (the
dropout seeds among them), the optimizer's variables (its step among them) and the training
memory. A loop call takes it, donates its buffers and returns the next, so no copy of it is
made; after each call the Keras variables are pointed at the new arrays (`keras.Variable.assign`
of the arrays themselves), which is what evaluation, checkpoints and `step` read.

Distribution is Keras 3's (tfxl/tpu/jax_mesh.py): the weights carry the layouts
`keras.distribution` gave them (replicated under DataParallel, split under ModelParallel), the
batch and the memory are split along the mesh's batch axis, and XLA (GSPMD) places the
collectives. The step computes on the global batch: the loss is the token-weighted mean over
every row, its gradient the gradient of that mean; clipping and the optimizer see the global
gradient, as on TensorFlow after the replicas' sum.

Shape glossary: n steps per loop, B global batch, T segment length.
"""

import functools

import keras
import numpy as np

from tfxl.checkpoints.training import TrainingMemory
from tfxl.train.loop.step_base import TrainStepBase
from tfxl.train.loop.optimization import OptimizerParams, clip_by_global_norm
from tfxl.train.tasks.task import Task


def check_precision(mixed_precision):
    """ValueError for a policy the JAX step does not train with: float16's loss scale is the
    TensorFlow step's."""
    if mixed_precision == "mixed_float16":
        raise ValueError("--mixed_precision=mixed_float16 trains on TensorFlow only (its loss "
                         "scale); on JAX use mixed_bfloat16")


class JaxTrainStep(TrainStepBase):
    """Trains `model` (built in `strategy.scope()`) on the train split of `data` with `task`'s
    loss, on JAX; the same interface as `TrainStep` (`step`, `train(n)`, `train_loop_begin`,
    `rewind_input`, `optimizer`, `memory`, `schedule`).

    Args:
      task, model, data, global_batch, optimizer, mixed_precision: as `TrainStepBase`'s
        (train/loop/step_base.py).
      strategy: a `tfxl.tpu.jax_mesh.JaxDistribution`.
      memory: the training memory (`JaxBackend.training_memory` of the task's `initial_memory`
        for the global batch), or None for a task without one.
    """

    replicas = "devices of the mesh's batch axis"
    compiles_ahead = True
    check_precision = staticmethod(check_precision)

    def __init__(self, task: Task, model, *, strategy, data, global_batch: int,
                 optimizer: OptimizerParams, memory, mixed_precision: str = "float32"):
        super().__init__(task, model, strategy=strategy, data=data, global_batch=global_batch,
                         optimizer=optimizer, mixed_precision=mixed_precision)
        self.memory = memory
        self._loops = None  # compiled at the first loop, for the state's layouts
        self._read_ahead = None  # the next loop's batches, read by compile_loop

    @property
    def step(self):
        return int(np.asarray(self.optimizer.iterations.value))

    @staticmethod
    def iterate(dataset):
        return dataset.as_numpy_iterator()

    # -- host ---------------------------------------------------------------------------------
    def train(self, num_steps):
        """Runs `num_steps` steps in one compiled call; returns {"loss", "grad_norm",
        "learning_rate"} per step."""
        self.train_loop_begin()
        first_step = self.step
        batches, self._read_ahead = self._read_ahead, None
        if batches is None or _loop_length(batches) != num_steps:
            batches = self._next_batches(num_steps)
        state = self._placed(self._state())
        state, losses, norms = self._compiled_loops(state)(state, batches)
        self._set_state(state)
        return self.train_loop_end(first_step, np.asarray(losses), np.asarray(norms))

    def compile_loop(self, num_steps):
        """Compiles the host loop of `num_steps` steps before its first call, on the batches it
        will read (read now: the next `train(num_steps)` runs on them), and returns the bytes
        XLA says it holds at its peak on one device (`tfxl.sizing.compiled_bytes` of its
        `memory_analysis()`), or None where the platform reports none. The call then finds the
        program compiled."""
        from tfxl.sizing import compiled_bytes
        self.train_loop_begin()
        self._read_ahead = self._next_batches(num_steps)
        state = self._placed(self._state())
        compiled = self._compiled_loops(state).lower(state, self._read_ahead).compile()
        analysis = compiled.memory_analysis()
        return None if analysis is None else compiled_bytes(analysis)

    def rewind_input(self):
        super().rewind_input()
        self._read_ahead = None  # batches of the step before a restore

    def _next_batches(self, num_steps):
        """The next `num_steps` batches as global arrays [n, B, ...]."""
        local = [next(self._iterator) for _ in range(num_steps)]
        return {key: self.strategy.global_array(np.stack([b[key] for b in local]), batch_axis=1)
                for key in local[0]}

    def _compiled_loops(self, state):
        if self._loops is None:
            import jax
            # The state leaves each loop laid out as it came in (the layouts Keras gave the
            # variables, the memory split along the batch): one compile per loop length.
            layouts = jax.tree_util.tree_map(lambda array: array.sharding, state)
            replicated = self.strategy.replicated()
            self._loops = jax.jit(self._loop_fn, donate_argnums=0,
                                  out_shardings=(layouts, replicated, replicated))
        return self._loops

    def _state(self):
        return ([v.value for v in self.model.trainable_variables],
                [v.value for v in self.model.non_trainable_variables],
                [v.value for v in self.optimizer.variables],
                None if self.memory is None else self.memory.value)

    def _placed(self, state):
        """The state with every array on the mesh: what Keras left on one device (variables
        it gives no layout, values a restore assigned) replicated, so that every loop call
        sees the layouts of the first and none compiles again."""
        import jax
        replicated = self.strategy.replicated()
        return jax.tree_util.tree_map(
            lambda array: (array if isinstance(array.sharding, jax.sharding.NamedSharding)
                           else jax.device_put(array, replicated)), state)

    def _set_state(self, state):
        trainable, non_trainable, optimizer_variables, memory = state
        for variables, values in ((self.model.trainable_variables, trainable),
                                  (self.model.non_trainable_variables, non_trainable),
                                  (self.optimizer.variables, optimizer_variables)):
            for variable, value in zip(variables, values):
                variable.assign(value)
        if self.memory is not None:
            self.memory.value = memory

    # -- compiled -----------------------------------------------------------------------------
    def _loss(self, trainable, non_trainable, batch, memory):
        model = self.model
        mapping = (list(zip(model.trainable_variables, trainable))
                   + list(zip(model.non_trainable_variables, non_trainable)))
        with keras.StatelessScope(state_mapping=mapping) as scope:
            weight = keras.ops.maximum(self.task.batch_weight(batch), 1.0)
            loss, new_memory = self.task.loss(model, batch, memory, weight)
        non_trainable = [scope.get_current_value(v) for v in model.non_trainable_variables]
        return loss, (non_trainable, new_memory)

    def _loop_fn(self, state, batches):
        import jax
        import jax.numpy as jnp

        def one_step(state, batch):
            trainable, non_trainable, optimizer_variables, memory = state
            (loss, (non_trainable, memory)), grads = jax.value_and_grad(
                self._loss, has_aux=True)(trainable, non_trainable, batch, memory)
            grads, norm = clip_by_global_norm(grads, self.clip)
            trainable, optimizer_variables = self.optimizer.stateless_apply(
                optimizer_variables, grads, trainable)
            return ((trainable, non_trainable, optimizer_variables, memory),
                    (loss.astype(jnp.float32), norm))

        state, (losses, norms) = jax.lax.scan(one_step, state, batches)
        return state, losses, norms


def _loop_length(batches):
    """n of a host loop's batches {key: [n, B, ...]}."""
    return next(iter(batches.values())).shape[0]


class JaxTrainingMemory(TrainingMemory):
    """The training memory on JAX: the global [B, ...] arrays of a memory, split along the
    mesh's batch axis (each device keeps its own streams, as a TensorFlow replica keeps its
    rows); its `TrainingMemory` side (tfxl/checkpoints/training.py) has the names and shapes
    of TensorFlow's: a checkpoint does not say which backend or how many devices wrote it."""

    def __init__(self, strategy, empty):
        import jax
        self.strategy = strategy
        self.value = jax.tree_util.tree_map(strategy.split_along_batch, empty)

    @functools.cached_property
    def checkpointed(self):
        """The tf.train.Checkpoint of the global copies, made at a checkpoint's first use of
        it: the step itself needs no TensorFlow (it trains where none is installed)."""
        import tensorflow as tf
        with tf.device("/cpu:0"):
            return tf.train.Checkpoint(**{
                key: tf.Variable(tf.zeros(value.shape, value.dtype), trainable=False)
                for key, value in self.value.to_dict().items()})

    def checkpoint_shapes(self):
        return {key: tuple(value.shape) for key, value in self.value.to_dict().items()}

    def save_to_checkpoint(self):
        for key, value in self.value.to_dict().items():
            getattr(self.checkpointed, key).assign(self.strategy.to_numpy(value))

    def restore_from_checkpoint(self, values):
        """The memory from the checkpoint's {name: global value}, split along the batch."""
        import jax
        from tfxl.layers.memory import as_memory
        memory = as_memory(values)
        self.value = jax.tree_util.tree_map(self.strategy.split_along_batch, memory)
