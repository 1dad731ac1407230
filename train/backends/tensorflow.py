"""The training run's backend on TensorFlow: a `tf.distribute` strategy (tfxl/tpu/strategy.py),
the replica step (train/loop/train_step.py), its evaluator (train/loop/evaluator.py), the
per-replica training memory (train/loop/memory_state.py) and the training checkpoint
(tfxl/checkpoints/training.py)."""

import numpy as np
import tensorflow as tf

from tfxl.train.backends import device_kind

__all__ = ["TensorFlowBackend", "gpu_memory_bytes"]

# The --strategy name of each tf.distribute strategy type (a subclass before its base).
STRATEGY_KINDS = ((tf.distribute.TPUStrategy, "tpu"),
                  (tf.distribute.MultiWorkerMirroredStrategy, "multi_worker_mirrored"),
                  (tf.distribute.MirroredStrategy, "mirrored"),
                  (tf.distribute.OneDeviceStrategy, "one_device"))


def gpu_memory_bytes():
    """The memory TensorFlow's allocator may use on each GPU (the smallest), or None when it does
    not say. Read once the devices are initialised (the strategy is created)."""
    try:
        from tfxl.private_apis import device_lib
        limits = [d.memory_limit for d in device_lib.list_local_devices()
                  if d.device_type == "GPU" and d.memory_limit]
    except Exception:  # no answer is "not checked", never a failed run
        return None
    return min(limits) if limits else None


class TensorFlowBackend:
    """`tfxl.train.backends.Backend` for a tf.distribute `strategy`."""

    name = "tensorflow"
    # The host loop's length is a tensor argument of one traced function.
    each_loop_length_compiles = False

    def __init__(self, strategy):
        from tfxl.tpu.jax_mesh import JaxDistribution
        if isinstance(strategy, JaxDistribution):
            raise TypeError(f"strategy={strategy!r} is a JAX distribution, and Keras runs on "
                            "TensorFlow here (KERAS_BACKEND): a tf.distribute strategy "
                            "(tfxl.tpu.resolve_strategy)")
        self.strategy = strategy

    def __repr__(self):
        return f"TensorFlowBackend({type(self.strategy).__name__})"

    # -- what it builds -------------------------------------------------------------------------
    def train_step(self, task, model, *, data, global_batch, optimizer,
                   mixed_precision="float32", jit_compile=False):
        from tfxl.train.loop.train_step import TrainStep
        rows = global_batch // self.strategy.num_replicas_in_sync  # each replica's memory
        return TrainStep(task, model, strategy=self.strategy, data=data,
                         global_batch=global_batch, optimizer=optimizer,
                         memory=self.training_memory(task.initial_memory(model, rows)),
                         mixed_precision=mixed_precision, jit_compile=jit_compile)

    def evaluator(self, model, *, data, global_batch, steps_per_loop=100, jit_compile=False,
                  progress=None):
        from tfxl.train.loop.evaluator import Evaluator
        return Evaluator(model, self.strategy, data, global_batch, steps_per_loop, jit_compile,
                         progress)

    def training_memory(self, empty):
        if empty is None:
            return None
        from tfxl.train.loop.memory_state import CheckpointedReplicaMemory
        return CheckpointedReplicaMemory(self.strategy, empty, "train_memory")

    def training_checkpoint(self, model, *, optimizer, memory, model_dir, worker_id=None):
        from tfxl.checkpoints.training import TrainingCheckpoint
        return TrainingCheckpoint(model, optimizer, memory, model_dir, worker_id)

    # -- what the run asks ----------------------------------------------------------------------
    @property
    def _resolver(self):
        return getattr(self.strategy, "cluster_resolver", None)

    @property
    def is_chief(self):
        """The chief of a cluster with one, else worker 0; one process is its own chief."""
        resolver = self._resolver
        if resolver is None or not resolver.task_type:
            return True
        return resolver.task_type == "chief" or (resolver.task_type == "worker" and
                                                 resolver.task_id == 0 and
                                                 "chief" not in resolver.cluster_spec().jobs)

    @property
    def worker_index(self):
        """The task id in the tf.distribute cluster (0 without one)."""
        resolver = self._resolver
        return resolver.task_id if resolver is not None else 0

    @property
    def strategy_kind(self):
        return next((name for kind, name in STRATEGY_KINDS
                     if isinstance(self.strategy, kind)), "default")

    @property
    def replicas(self):
        return self.strategy.num_replicas_in_sync

    @property
    def local_devices(self):
        """The devices of this host's replicas (the default strategy: where TensorFlow places
        ops)."""
        try:
            return list(self.strategy.extended.worker_devices)
        except RuntimeError:  # the default strategy has none: the first GPU, else the CPU
            return ["/device:GPU:0" if tf.config.list_logical_devices("GPU")
                    else "/device:CPU:0"]

    @property
    def device_kind(self):
        return device_kind(self.local_devices)

    @property
    def model_axis(self):
        return 1  # every replica holds the whole model

    def device_memory_bytes(self):
        return gpu_memory_bytes()

    def worker_tasks(self):
        """Every worker of a MultiWorkerMirroredStrategy as "chief 0", "worker 0", ... in cluster
        order; one worker otherwise (Mirrored and TPU strategies have one Python process)."""
        resolver = self._resolver
        if (not isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy)
                or resolver is None):
            return ["worker 0"], 0
        spec = resolver.cluster_spec().as_dict()
        tasks = [f"{job} {i}" for job in ("chief", "worker")
                 for i in range(len(spec.get(job, ())))]
        if len(tasks) <= 1:
            return ["worker 0"], 0
        return tasks, tasks.index(f"{resolver.task_type} {resolver.task_id}")

    def stop_agreement(self):
        """One all-reduce over the replicas of every worker's one-hot signal
        (train/records/preemption.py);
        None with one worker."""
        tasks, own = self.worker_tasks()
        if len(tasks) == 1:
            return None
        strategy = self.strategy

        @tf.function
        def exchange(signum):
            def replica_fn(signum):
                mine = tf.one_hot(own, len(tasks)) * tf.cast(signum, tf.float32)
                return tf.distribute.get_replica_context().all_reduce(
                    tf.distribute.ReduceOp.SUM, mine)
            summed = strategy.run(replica_fn, args=(signum,))
            return strategy.experimental_local_results(summed)[0]

        def per_worker(signum):
            summed = exchange(tf.constant(signum, tf.int32)).numpy()
            # Every replica of a worker added the worker's signal; every worker has as many
            # replicas.
            return np.rint(summed * len(tasks) / strategy.num_replicas_in_sync).astype(int)

        return per_worker
