"""Transformer-XL memory as per-replica training state.

Shape glossary: B global batch, b = B / R per-replica batch (R replicas), L layers, M memory
length, D model size.

Why ON_READ variables rather than loop-carried tensors: the memory must survive between host loops
(the reference TPU code and Model Garden reset it every loop) and between a checkpoint and a resume.
A `keras.Variable(synchronization="on_read", aggregation="none", trainable=False)` created under the
strategy scope has one copy per replica, lives on that replica's device, is read and assigned inside
`strategy.run` with no host round trip, and never enters `trainable_variables`, so no gradient or
optimizer slot ever touches it. Reading it across replicas goes through `strategy.gather`, which is
how it is checkpointed: before a save the per-replica copies are gathered, in replica order, into a
plain global [B, ...] variable that tf.train.Checkpoint tracks; after a restore each replica takes
back its rows. Batch slot g of the global batch is replica g // b, row g % b, the same order
`input_fn` uses, so the checkpoint does not depend on the number of replicas that wrote it.
"""

import keras
import numpy as np
import tensorflow as tf

from tfxl.layers.memory import STATES, VALID


class ReplicaMemory:
    """Per-replica memory of `per_replica_batch` rows and `mem_len` slots."""

    def __init__(self, strategy, n_layer, mem_len, d_model, per_replica_batch, dtype, name):
        self.strategy = strategy
        self.global_batch = per_replica_batch * strategy.num_replicas_in_sync
        self.per_replica_batch = per_replica_batch
        shape = (per_replica_batch, n_layer, mem_len, d_model)
        on_read = dict(trainable=False, synchronization="on_read", aggregation="none")
        with strategy.scope():
            self.states = keras.Variable(np.zeros(shape, np.float32), dtype=dtype,
                                         name=f"{name}_states", **on_read)
            self.valid = keras.Variable(np.zeros(shape[:1] + (mem_len,), bool), dtype="bool",
                                        name=f"{name}_valid", **on_read)
        self.gather = tf.function(self._gather)
        self.restore_from_checkpoint = tf.function(self._restore_from_checkpoint)
        # Global copies for checkpoints; plain variables outside the strategy.
        with tf.device("/cpu:0"):
            self.checkpointed = tf.train.Checkpoint(
                states=tf.Variable(tf.zeros((self.global_batch,) + shape[1:], self.states.dtype),
                                   trainable=False),
                valid=tf.Variable(tf.zeros((self.global_batch, mem_len), tf.bool),
                                  trainable=False))

    # -- replica context ----------------------------------------------------------------------
    def read(self):
        return {STATES: self.states.value, VALID: self.valid.value}

    def write(self, memory):
        self.states.assign(tf.cast(memory[STATES], self.states.dtype))
        self.valid.assign(memory[VALID])

    # -- cross-replica context ----------------------------------------------------------------
    # Cross-replica methods; gather/restore are wrapped in tf.function per instance in __init__
    # (TPUStrategy.run only runs inside one).
    def clear(self):
        """Invalidates every row of every replica (start of an evaluation pass)."""
        for copy in self.strategy.experimental_local_results(self.valid.value):
            copy.assign(tf.zeros_like(copy))

    def _gather(self):
        """The global memory: per-replica copies concatenated in replica order."""
        # Collectives take float32/int32, not bfloat16/bool: widen, gather, narrow back.
        per_replica = self.strategy.run(
            lambda: {STATES: tf.cast(self.states.value, tf.float32),
                     VALID: tf.cast(self.valid.value, tf.int32)})
        return {STATES: tf.cast(self.strategy.gather(per_replica[STATES], axis=0),
                                self.states.dtype),
                VALID: tf.cast(self.strategy.gather(per_replica[VALID], axis=0), tf.bool)}

    def save_to_checkpoint(self):
        memory = self.gather()
        self.checkpointed.states.assign(memory[STATES])
        self.checkpointed.valid.assign(memory[VALID])

    def _restore_from_checkpoint(self):
        b = self.per_replica_batch

        def take_rows(states, valid):
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            rows = tf.range(b) + tf.cast(replica, tf.int32) * b
            self.states.assign(tf.gather(states, rows))
            self.valid.assign(tf.gather(valid, rows))

        # The global copies live on the host: read them here and hand them to the replicas as
        # arguments (a TPU computation cannot read a host variable itself).
        self.strategy.run(take_rows, args=(self.checkpointed.states.read_value(),
                                           self.checkpointed.valid.read_value()))
