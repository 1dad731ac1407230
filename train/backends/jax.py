"""The training run's backend on JAX: a `tfxl.tpu.jax_mesh.JaxDistribution` (Keras 3's
distribution API), the functional step and its training memory (train/loop/jax_train_step.py), its
evaluator (train/loop/jax_evaluator.py) and the training checkpoint (tfxl/checkpoints/training.py).

The step imports no TensorFlow (it trains where none is installed); the evaluator and the
checkpoint do, when they are built."""

from tfxl.tpu.jax_mesh import JaxDistribution
from tfxl.train.backends import device_kind

__all__ = ["JaxBackend"]


class JaxBackend:
    """`tfxl.train.backends.Backend` for a `JaxDistribution` (the processes of a run are its
    workers, process 0 the chief)."""

    name = "jax"
    # A host loop is a `lax.scan` over its batches: each length is a program of its own.
    each_loop_length_compiles = True

    def __init__(self, strategy):
        if not isinstance(strategy, JaxDistribution):
            raise TypeError(f"strategy={strategy!r} is not a JAX distribution, and Keras runs on "
                            "JAX here (KERAS_BACKEND): a tfxl.tpu.jax_mesh.JaxDistribution "
                            "(resolve_distribution)")
        self.strategy = strategy

    def __repr__(self):
        return f"JaxBackend({self.strategy!r})"

    # -- what it builds -------------------------------------------------------------------------
    def train_step(self, task, model, *, data, global_batch, optimizer,
                   mixed_precision="float32", jit_compile=False):
        """The jitted step (`jit_compile` is implied: JAX compiles the whole step)."""
        del jit_compile
        from tfxl.train.loop.jax_train_step import JaxTrainStep
        return JaxTrainStep(task, model, strategy=self.strategy, data=data,
                            global_batch=global_batch, optimizer=optimizer,
                            memory=self.training_memory(task.initial_memory(model, global_batch)),
                            mixed_precision=mixed_precision)

    def evaluator(self, model, *, data, global_batch, steps_per_loop=100, jit_compile=False,
                  progress=None):
        del jit_compile  # a jitted step, always
        from tfxl.train.loop.jax_evaluator import JaxEvaluator
        return JaxEvaluator(model, self.strategy, data, global_batch, steps_per_loop, progress)

    def training_memory(self, empty):
        if empty is None:
            return None
        from tfxl.train.loop.jax_train_step import JaxTrainingMemory
        return JaxTrainingMemory(self.strategy, empty)

    def training_checkpoint(self, model, *, optimizer, memory, model_dir, worker_id=None):
        from tfxl.checkpoints.training import TrainingCheckpoint
        return TrainingCheckpoint(model, optimizer, memory, model_dir, worker_id,
                                  to_numpy=self.strategy.to_numpy)

    # -- what the run asks ----------------------------------------------------------------------
    @property
    def is_chief(self):
        return self.strategy.is_chief

    @property
    def worker_index(self):
        return self.strategy.process_index

    @property
    def strategy_kind(self):
        return self.strategy.kind

    @property
    def replicas(self):
        return self.strategy.num_replicas_in_sync

    @property
    def local_devices(self):
        return self.strategy.local_device_names

    @property
    def device_kind(self):
        return device_kind(self.local_devices)

    @property
    def model_axis(self):
        """model_parallel: a replica is this many devices, each holding a part of the
        weights."""
        return self.strategy.mesh_shape[1]

    def device_memory_bytes(self):
        return self.strategy.device_memory_bytes()

    def worker_tasks(self):
        return ([f"process {i}" for i in range(self.strategy.process_count)],
                self.strategy.process_index)

    def stop_agreement(self):
        """Every process's value, gathered (None with one process)."""
        return self.strategy.all_processes if self.strategy.process_count > 1 else None
