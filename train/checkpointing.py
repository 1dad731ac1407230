"""What a training checkpoint holds and where it goes (the weights-only restore of evaluation,
export and generation is tfxl.checkpoints.restore_weights).

A training checkpoint tracks the model, the optimizer (with its step), the per-replica training
memory and the state of every dropout seed generator, so a resumed run draws the same masks and
continues step for step. The input position is the step (train/train_step.py). Which checkpoint to
read, skipping damaged ones, is tfxl/checkpoints.py's.

Nothing is written before the first save: the CheckpointManager (which reads TensorFlow's
`checkpoint` state file) is made then, or by `prepare_to_save`, which first rewrites a damaged
state file from the checkpoint files, saying so.
"""

import os

import tensorflow as tf

from tfxl.checkpoint_tree import CheckpointTree, read_checkpoint
from tfxl.checkpoints import (checkpoint_state_damage, newest_readable_checkpoint,
                              restore_fitting, rewrite_checkpoint_state)
from tfxl.model_dir import CHECKPOINT_STATE, ModelDir


def seed_generator_states(model):
    """The state variable of every Keras SeedGenerator of `model` (dropout), in the order of
    `model.non_trainable_variables` (the order of the checkpoint keys `rng/seed_<i>`).

    Keras keeps SeedGenerators out of TensorFlow's object graph, so `Checkpoint(model=...)` does
    not save them; their state variables are among the model's (every one named
    `seed_generator_state` by Keras), and they are tracked here explicitly.
    """
    return [variable.value for variable in model.non_trainable_variables
            if variable.name == "seed_generator_state"]


class TrainingCheckpoint:
    """Saves and restores a training job: model, optimizer, memory, dropout seeds.

    Args:
      model, optimizer: built under the strategy.
      memory: the trainer's `CheckpointedReplicaMemory`, or None (a model that carries no state
        from step to step, e.g. the document classifier: each step reads whole documents).
      model_dir: checkpoints go to model_dir/checkpoints (the chief's).
      worker_id: None on the chief; a MultiWorker worker's id otherwise (every worker saves, only
        the chief's copy is kept: the others write under model_dir/tmp_worker_checkpoints/).

    `before_save` and `after_save` hold callables (step) run around every save: the train log
    writes its lines before a checkpoint of their steps exists (train/train_log.py).
    """

    def __init__(self, model, optimizer, memory, model_dir, worker_id=None):
        # The keys the checkpoints of earlier versions used, so that they still resume.
        rng = tf.train.Checkpoint(**{f"seed_{i}": state for i, state in
                                     enumerate(seed_generator_states(model))})
        self._track(dict(model=model, optimizer=optimizer, rng=rng), memory, model_dir,
                    worker_id)

    def _track(self, trackables, memory, model_dir, worker_id):
        self.memory = memory
        carried = {} if memory is None else {"memory": memory.checkpointed}
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
        Damaged checkpoints are skipped with a message through `log`."""
        latest = newest_readable_checkpoint(self.directory, log)
        if latest:
            restore_fitting(self.checkpoint, latest, "this model/run")
            if self.memory is not None:
                self.memory.restore_from_checkpoint()
        return latest

    def save(self, step):
        for hook in self.before_save:
            hook(step)
        self.stage_values()
        path = self.manager.save(checkpoint_number=step)
        for hook in self.after_save:
            hook(step)
        return path

    def stage_values(self):
        """Copies what a save writes into the checkpoint's own variables (the memory's global
        copy; on JAX also the mirrors of every variable)."""
        if self.memory is not None:
            self.memory.save_to_checkpoint()


class JaxTrainingCheckpoint(TrainingCheckpoint):
    """The training checkpoint of a run on JAX: the same files, paths and keys as on
    TensorFlow (tfxl/checkpoint_tree.py mirrors the model and optimizer by the paths TensorFlow
    gives them), so a JAX run resumes from a TensorFlow run's checkpoint and the TensorFlow
    tools read a JAX run's.

    Args:
      model, optimizer, model_dir, worker_id: as `TrainingCheckpoint`'s.
      memory: the step's `JaxTrainingMemory`, or None.
      to_numpy: a (possibly multi-host) array's whole value on this host.
    """

    def __init__(self, model, optimizer, memory, model_dir, worker_id=None, *, to_numpy):
        seeds = [v for v in model.non_trainable_variables if v.name == "seed_generator_state"]
        self.roots = dict(model=model, optimizer=optimizer,
                          rng={f"seed_{i}": seed for i, seed in enumerate(seeds)})
        self.tree = CheckpointTree(to_numpy=lambda variable: to_numpy(variable.value),
                                   **self.roots)
        self._track(self.tree.trackables, memory, model_dir, worker_id)

    def restore(self, log=print):
        latest = newest_readable_checkpoint(self.directory, log)
        if latest:
            memory = ({} if self.memory is None else
                      {f"memory/{name}": shape
                       for name, shape in self.memory.checkpointed_shapes().items()})
            values = read_checkpoint(latest, "this model/run", arrays=memory, **self.roots)
            if self.memory is not None:
                self.memory.restore_from({name.split("/", 1)[1]: value
                                          for name, value in values.items()})
        return latest

    def stage_values(self):
        self.tree.pull()
        super().stage_values()
