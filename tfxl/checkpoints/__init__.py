"""Checkpoints, in one room: which ones exist and read cleanly, how Keras objects are written to
and read from them on any backend, what a training checkpoint holds, and the models and weights
loaded from them.

* `finding`: the newest readable checkpoint (damaged ones skipped, with a message), the
  `checkpoint` state file checked and rebuilt from the listing.
* `tree`: TensorFlow-format checkpoints of Keras objects on any backend (`CheckpointTree`,
  `read_checkpoint`), and `restore_weights`, the one weights-only restore.
* `training`: `TrainingCheckpoint` (model, optimizer, dropout seeds and the `TrainingMemory`
  of a run, on either backend).
* `warm_start`: `tfxl-train --init_checkpoint`, a new run from another model's weights.
* `loading`: a model from a `.keras` file, a model_dir or an export, and what a `--model`
  path holds.

Importing this package imports none of them (no TensorFlow, no model): import the module whose
names are used (`from tfxl.checkpoints.finding import newest_readable_checkpoint`). Only
`loading` imports the model; tfxl/models/ imports nothing from here.
"""
