"""Per-replica state of training and evaluation: the memory and the position keys.

Shape glossary: B global batch, b = B / R per-replica batch (R replicas), L layers, M memory
length, T segment length, K = M + T keys, D model size, N heads, H head size.

Why ON_READ variables rather than loop-carried tensors: the memory must survive between host loops
(the reference TPU code and Model Garden reset it every loop) and between a checkpoint and a resume.
A `keras.Variable(synchronization="on_read", aggregation="none", trainable=False)` created under the
strategy scope has one copy per replica, lives on that replica's device, is read and assigned inside
`strategy.run` with no host round trip, and never enters `trainable_variables`, so no gradient or
optimizer slot ever touches it.

A memory is one of two types (`tfxl.layers.memory`): training keeps the `LayerInputMemory` (W_k
and W_v learn through it), evaluation the `KeyValueMemory` (each step projects only its T new
rows). `ReplicaMemory` holds either, one ON_READ variable per tensor (`MemoryVariables`).

Only the training memory is checkpointed (`CheckpointedReplicaMemory`); an evaluation pass starts
from an empty memory. Reading a memory across replicas goes through `strategy.gather`, which is
how it is checkpointed: before a save the per-replica copies are gathered, in replica order, into
plain global [B, ...] variables that tf.train.Checkpoint tracks; after a restore each replica takes
back its rows. Batch slot g of the global batch is replica g // b, row g % b, the same order
`input_fn` uses, so the checkpoint does not depend on the number of replicas that wrote it.
"""

import keras
import tensorflow as tf

from tfxl.checkpoints.training import TrainingMemory
from tfxl.layers.memory import as_memory
from tfxl.models.memory_variables import MemoryVariables


def replica_variable(strategy, initial_value, name):
    """One copy of `initial_value` per replica, read and written in replica context."""
    with strategy.scope():
        return keras.Variable(initial_value, dtype=initial_value.dtype, trainable=False,
                              synchronization="on_read", aggregation="none", name=name)


class ReplicaMemory(MemoryVariables):
    """A memory of either type, b rows per replica: `read` and `write` in replica context.

    Args:
      strategy: the distribution strategy.
      empty: one replica's empty memory, e.g. `model.init_key_value_memory(b, M)`; gives the
        type, shapes [b, ...] and dtypes of the variables.
      name: prefix of the variable names.
    """

    def __init__(self, strategy, empty, name):
        super().__init__(empty, name, lambda value, name: replica_variable(strategy, value, name))
        self.strategy = strategy
        self.per_replica_batch = int(empty.valid.shape[0])
        self.global_batch = self.per_replica_batch * strategy.num_replicas_in_sync
        # Cross-replica reads run in a tf.function (TPUStrategy.run only runs inside one).
        self.gather = tf.function(self._gather)

    # -- cross-replica context ----------------------------------------------------------------
    def clear(self):
        """Invalidates every row of every replica (start of an evaluation pass)."""
        for copy in self.strategy.experimental_local_results(self.valid.value):
            copy.assign(tf.zeros_like(copy))

    def _gather(self):
        """The global memory: per-replica copies concatenated in replica order."""
        # Collectives take float32/int32, not bfloat16/bool: widen, gather, narrow back.
        def wide(dtype):
            return tf.int32 if tf.as_dtype(dtype) == tf.bool else tf.float32

        per_replica = self.strategy.run(lambda: tf.nest.map_structure(
            lambda variable: tf.cast(variable.value, wide(variable.dtype)), self.variables))
        return tf.nest.map_structure(
            lambda value, variable: tf.cast(self.strategy.gather(value, axis=0), variable.dtype),
            per_replica, self.variables)


class CheckpointedReplicaMemory(ReplicaMemory, TrainingMemory):
    """The training memory on TensorFlow: a `ReplicaMemory` with the global copies a checkpoint
    holds, the `TrainingMemory` of tfxl/checkpoints/training.py.

    `checkpointed` is the trackable to put in the checkpoint; `save_to_checkpoint()` before a
    save, `restore_from_checkpoint(values)` after a read (both cross-replica). Its variables are
    named as the memory's dict form names its tensors ("states", "valid").
    """

    def __init__(self, strategy, empty, name):
        super().__init__(strategy, empty, name)
        self._take_rows = tf.function(self._take_rows_fn)
        # Global copies for checkpoints; plain variables outside the strategy.
        with tf.device("/cpu:0"):
            self.checkpointed = tf.train.Checkpoint(**{
                key: tf.Variable(tf.zeros(shape, value.dtype), trainable=False)
                for (key, shape), value in zip(self.checkpoint_shapes().items(),
                                               empty.to_dict().values())})

    def checkpoint_shapes(self):
        return {key: (self.global_batch,) + tuple(value.shape[1:])
                for key, value in self.variables.to_dict().items()}

    def save_to_checkpoint(self):
        for key, value in self.gather().to_dict().items():
            getattr(self.checkpointed, key).assign(value)

    def restore_from_checkpoint(self, values):
        """Each replica takes its rows of the global `values` ({name: [B, ...]})."""
        self._take_rows({key: values[key] for key in self.variables.to_dict()})

    def _take_rows_fn(self, values):
        b = self.per_replica_batch

        def take_rows(memory):
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            rows = tf.range(b) + tf.cast(replica, tf.int32) * b
            self.write(tf.nest.map_structure(lambda value: tf.gather(value, rows), memory))

        # The global values live on the host: they reach the replicas as arguments (a TPU
        # computation cannot read a host variable itself).
        self.strategy.run(take_rows, args=(as_memory(values),))


class ReplicaPositionKeys:
    """What `model.position_keys(K, clamp_len)` gives, one copy per replica: every layer's
    position keys W_k,R R for Transformer-XL, nothing for a baseline (an empty tuple).

    Why a per-replica variable: the keys depend only on the weights, K and clamp_len, so one
    `refresh()` at the start of an evaluation pass (a single `strategy.run`) computes them on every
    replica, and each eval step of the pass reads its own replica's copy in place. Nothing is
    recomputed per step, nothing is copied host-to-device per step (what handing a host tensor to
    every `strategy.run` would cost on TPU), the XLA-compiled step receives them as an ordinary
    input, and host loops of one pass share them. Refreshing per pass, not once, follows the
    weights, which change between the evaluations of a training run.

    Args:
      strategy, model: the strategy and the language model built under it.
      key_length: K = M + T, a Python int. clamp_len: the distance clamp (-1: none).
    """

    def __init__(self, strategy, model, key_length, clamp_len, name):
        self.strategy, self.model = strategy, model
        self.key_length, self.clamp_len = int(key_length), int(clamp_len)
        # The keys' structure and shapes from a trace of the model's computation (nothing
        # runs): L tensors [N, H, K + 1] for Transformer-XL, none for a baseline.
        keys = tf.function(self._compute).get_concrete_function().structured_outputs
        self.variables = tf.nest.map_structure(
            lambda key: replica_variable(strategy, tf.zeros(key.shape, key.dtype), name), keys)
        self.refresh = tf.function(self._refresh)

    def _compute(self):
        return self.model.position_keys(self.key_length, self.clamp_len)

    def read(self):
        """In replica context: what `model(position_keys=)` takes (a list of L tensors
        [N, H, K + 1] for Transformer-XL)."""
        return tf.nest.map_structure(lambda variable: variable.value, self.variables)

    def _refresh(self):
        """Cross-replica: recomputes every replica's copy from the current weights."""
        def compute():
            tf.nest.map_structure(lambda variable, key: variable.assign(key), self.variables,
                                  self._compute())

        self.strategy.run(compute)
