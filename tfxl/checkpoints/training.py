"""What a training checkpoint holds and where it goes, on either backend (the weights-only
restore of evaluation, export and generation is tfxl/checkpoints/tree.py's `restore_weights`).

A training checkpoint tracks the model, the optimizer (with its step), the training memory and
the state of every dropout seed generator, so a resumed run draws the same masks and continues
step for step. The input position is the step (the train steps' `rewind_input`). Which
checkpoint to read, skipping damaged ones, is tfxl/checkpoints/finding.py's.

The same files, paths and keys on every backend: on TensorFlow the Keras objects are tracked
themselves; elsewhere, where they are not trackable, `CheckpointTree` mirrors them at the paths
TensorFlow gives them (tfxl/checkpoints/tree.py). A JAX run resumes from a TensorFlow run's
checkpoint, and the TensorFlow tools read a JAX run's. The training memory is the train step's,
seen through `TrainingMemory` (the same names and global shapes whichever backend and however
many replicas or devices wrote it).

Nothing is written before the first save: the CheckpointManager (which reads TensorFlow's
`checkpoint` state file) is made then, or by `prepare_to_save`, which first rewrites a damaged
state file from the checkpoint files, saying so.
"""

import os
from typing import Mapping, Protocol

from tfxl.checkpoints.finding import (checkpoint_state_damage, newest_readable_checkpoint,
                                      rewrite_checkpoint_state)
from tfxl.checkpoints.tree import CheckpointTree, read_checkpoint, restore_fitting
from tfxl import backend
from tfxl.deferred import deferred_import
from tfxl.model_dir import CHECKPOINT_STATE, ModelDir

keras = deferred_import("keras")
tf = deferred_import("tensorflow")

# What a training checkpoint calls its parts (the first part of every key).
MODEL, OPTIMIZER, SEEDS, MEMORY = "model", "optimizer", "rng", "memory"
FITS = "this model/run"  # what a checkpoint that does not fit does not fit, for the message


class TrainingMemory(Protocol):
    """The training memory as a checkpoint sees it: global [B, ...] tensors named as the
    memory's dict form names them ("states", "valid"), whichever backend holds it and however
    many replicas or devices share it (train/loop/memory_state.py's `CheckpointedReplicaMemory` on
    TensorFlow, train/loop/jax_train_step.py's `JaxTrainingMemory` on JAX).
    """

    # The tf.train.Checkpoint of the global copies, one variable per name: what a training
    # checkpoint tracks as `memory`.
    checkpointed: object

    def checkpoint_shapes(self) -> Mapping[str, tuple]:
        """{name: global shape} of what a checkpoint holds."""

    def save_to_checkpoint(self) -> None:
        """Copies the memory into `checkpointed` (before a save)."""

    def restore_from_checkpoint(self, values: Mapping[str, object]) -> None:
        """Takes the memory from `values`, {name: global value} as a checkpoint holds it (after
        the checkpoint is read)."""


def seed_generator_states(model):
    """The state variable of every Keras SeedGenerator of `model` (dropout), in the order of
    `model.non_trainable_variables` (the order of the checkpoint keys `rng/seed_<i>`).

    Keras keeps SeedGenerators out of TensorFlow's object graph, so `Checkpoint(model=...)` does
    not save them; their state variables are among the model's (every one named
    `seed_generator_state` by Keras), and they are tracked here explicitly.
    """
    return [variable for variable in model.non_trainable_variables
            if variable.name == "seed_generator_state"]


class TrainingCheckpoint:
    """Saves and restores a training job: model, optimizer, memory, dropout seeds.

    Args:
      model, optimizer: built under the strategy.
      memory: the train step's `TrainingMemory`, or None (a model that carries no state from
        step to step, e.g. the document classifier: each step reads whole documents).
      model_dir: checkpoints go to model_dir/checkpoints (the chief's).
      worker_id: None on the chief; a MultiWorker worker's id otherwise (every worker saves, only
        the chief's copy is kept: the others write under model_dir/tmp_worker_checkpoints/).
      to_numpy: off TensorFlow, a (possibly multi-host) array's whole value on this host
        (default `keras.ops.convert_to_numpy`).

    `before_save` and `after_save` hold callables (step) run around every save: the train log
    writes its lines before a checkpoint of their steps exists (train/records/train_log.py).
    """

    def __init__(self, model, optimizer, memory, model_dir, worker_id=None, *, to_numpy=None):
        self.memory = memory
        self.roots = {MODEL: model, OPTIMIZER: optimizer,
                      SEEDS: {f"seed_{i}": state
                              for i, state in enumerate(seed_generator_states(model))}}
        if backend.current().VARIABLES_ARE_TRACKABLE:
            self.tree, trackables = None, self.roots
        else:
            self.tree = CheckpointTree(
                to_numpy=to_numpy and (lambda variable: to_numpy(variable.value)), **self.roots)
            trackables = self.tree.trackables
        carried = {} if memory is None else {MEMORY: memory.checkpointed}
        self.checkpoint = tf.train.Checkpoint(**trackables, **carried)
        layout = ModelDir(model_dir)
        self.directory = layout.checkpoints
        self.own = self.directory if worker_id is None else layout.worker_checkpoints(worker_id)
        self._manager = None
        self.before_save, self.after_save = [], []

    @property
    def manager(self):
        if self._manager is None:
            self.prepare_to_save()
        return self._manager

    def prepare_to_save(self, log=print):
        """Makes the CheckpointManager; a damaged `checkpoint` state file (empty, garbage, not
        UTF-8), which it would refuse or misread, is first rewritten from the checkpoint files."""
        damage = checkpoint_state_damage(self.own)
        if damage:
            names = rewrite_checkpoint_state(self.own)
            log(f"the checkpoint state file {os.path.join(self.own, CHECKPOINT_STATE)} was "
                f"damaged ({damage}): "
                + (f"rewritten from the checkpoint files ({', '.join(names)})" if names
                   else "removed (there is no checkpoint)"))
        self._manager = tf.train.CheckpointManager(self.checkpoint, self.own, max_to_keep=3)

    def restore(self, log=print):
        """Restores the newest readable checkpoint; returns its path, None when there is none.
        Damaged checkpoints are skipped with a message through `log`; one that does not fit is
        a ValueError, before anything is assigned on a backend other than TensorFlow."""
        latest = newest_readable_checkpoint(self.directory, log)
        if latest:
            memory = self._read(latest)
            if self.memory is not None:
                self.memory.restore_from_checkpoint(memory)
        return latest

    def _read(self, path):
        """Reads the checkpoint `path` into the model, optimizer and seeds; returns the memory's
        {name: global value} ({} without a memory)."""
        shapes = {} if self.memory is None else self.memory.checkpoint_shapes()
        if self.tree is None:  # the objects themselves, the memory's global copies among them
            restore_fitting(self.checkpoint, path, FITS)
            return {name: getattr(self.memory.checkpointed, name).read_value() for name in shapes}
        values = read_checkpoint(path, FITS, **self.roots, arrays={
            f"{MEMORY}/{name}": shape for name, shape in shapes.items()})
        return {name.split("/", 1)[1]: value for name, value in values.items()}

    def save(self, step):
        for hook in self.before_save:
            hook(step)
        self.stage_values()
        path = self.manager.save(checkpoint_number=step)
        for hook in self.after_save:
            hook(step)
        return path

    def stage_values(self):
        """Copies what a save writes into the checkpoint's own variables: the memory's global
        copies, and off TensorFlow the mirrors of every Keras variable."""
        if self.tree is not None:
            self.tree.pull()
        if self.memory is not None:
            self.memory.save_to_checkpoint()
