"""Which checkpoint to load: the newest one whose files read back cleanly.

Used by training (resume), evaluation and loading for export/generation, so all of them skip the
same damaged checkpoints for the same reason; `restore_weights` is the one weight-only restore
(evaluation, export, generation).

A checkpoint is *damaged* when its index or data files cannot be read back in full (a truncated
copy, a disk error, garbage written over it). Restoring one fails deep inside TensorFlow with an
IndexError ("Read less bytes than requested") or a DataLossError, or, for an index that does not
parse, with an error that reads like a model mismatch. Reading every tensor once with a
CheckpointReader tells the two apart before anything is restored: the index is a checksummed
table and every tensor carries a CRC32C, so any changed byte is found. The cost is one extra read
of the checkpoint when a job starts (restore reads the same bytes again); nothing else is read.

TensorFlow's `checkpoint` state file is a cache here: which checkpoints exist is found by listing
their `.index` files, so a damaged state file (empty, garbage, bytes that are not UTF-8) never
hides an intact checkpoint. `checkpoint_state_damage` says why one cannot be used, and
`rewrite_checkpoint_state` rebuilds it from the listing (training does before its next save:
tf.train.CheckpointManager reads it, and raises on an empty one).
"""

import os
import re
import sys

from google.protobuf import text_format

from tfxl.model_dir import CHECKPOINT_STATE
from tfxl.deferred import deferred_import

tf = deferred_import("tensorflow")


class DamagedCheckpoint(ValueError):
    """A checkpoint whose files cannot be read back; the message names it and says why."""


def why_damaged(path):
    """Why the checkpoint `path` (a prefix such as .../ckpt-20) cannot be read; None if it can."""
    try:
        reader = tf.train.load_checkpoint(path)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except (tf.errors.OpError, IndexError, ValueError) as err:
        lines = str(err).strip().splitlines() or [type(err).__name__]
        return lines[0].split("}}")[-1].strip()  # drop TF's "{{function_node ...}}" prefix
    return None


def check_readable(path):
    """Raises ValueError if `path` is not a checkpoint, DamagedCheckpoint if it does not read."""
    if not tf.io.gfile.exists(f"{path}.index"):
        raise ValueError(f"checkpoint {path} not found (no {path}.index)")
    reason = why_damaged(path)
    if reason:
        raise DamagedCheckpoint(f"checkpoint {path} is damaged: {reason}")
    return path


def _step(prefix):
    match = re.search(r"-(\d+)$", prefix)
    return int(match.group(1)) if match else -1


def checkpoints_newest_first(directory):
    """Every checkpoint prefix in `directory`, highest step first.

    The files are listed rather than read from the `checkpoint` state file, so a checkpoint whose
    save was killed after its files were in place but before the state file was updated counts.
    """
    if not tf.io.gfile.isdir(directory):
        return []
    prefixes = [p[:-len(".index")] for p in tf.io.gfile.glob(os.path.join(directory, "*.index"))]
    return sorted(prefixes, key=lambda p: (_step(p), p), reverse=True)


_DATA_FILE = re.compile(r"\.data-\d+-of-\d+$")


def checkpoints_without_index(directory):
    """The prefixes in `directory` that have data files but no `.index` (deleted, or a save
    killed between merging its data and its index): not checkpoints, but worth naming when a
    job passes over them to an older one."""
    if not tf.io.gfile.isdir(directory):
        return []
    prefixes = {_DATA_FILE.sub("", p) for p in tf.io.gfile.glob(os.path.join(directory, "*.data-*"))
                if _DATA_FILE.search(p)}
    return sorted(p for p in prefixes if not tf.io.gfile.exists(f"{p}.index"))


def newest_readable_checkpoint(directory, log=None):
    """The newest checkpoint in `directory` that reads cleanly; None if there is no checkpoint.

    Each damaged checkpoint passed over is reported through `log` (default: stderr), a newer one
    whose `.index` is missing included. If every checkpoint is damaged this raises
    DamagedCheckpoint rather than returning None, so that training never silently starts again
    from scratch over them. Prefixes without an index alone are no checkpoint (a first save killed
    before its index, as kill -9 leaves it): they are named, and the result is None.
    """
    log = log or (lambda message: print(message, file=sys.stderr))
    skipped = []
    without_index = {path: f"its index {os.path.basename(path)}.index is missing (deleted, "
                           "or its save has not finished)"
                     for path in checkpoints_without_index(directory)}
    candidates = checkpoints_newest_first(directory) + list(without_index)
    for path in sorted(candidates, key=lambda p: (_step(p), p), reverse=True):
        reason = without_index.get(path) or why_damaged(path)
        if reason is None:
            return path
        log(f"skipping damaged checkpoint {path}: {reason}")
        if path not in without_index:
            skipped.append(f"{os.path.basename(path)}: {reason}")
    if skipped:
        raise DamagedCheckpoint(f"no readable checkpoint in {directory}: every one is damaged "
                                f"({'; '.join(skipped)}); move them away to start from scratch")
    return None


def restore_weights(model, checkpoint=None, directory=None, fits="this model", log=None):
    """Restores only `model`'s weights (not the optimizer, step or memory a training checkpoint
    also holds) for evaluation, export or generation, on any Keras backend; returns the
    checkpoint path.

    From `checkpoint`, which must read cleanly, else from the newest readable checkpoint in
    `directory` (damaged newer ones reported through `log`). ValueError when there is none, or
    when it does not fit `fits` (what the model was built from, for the message).
    """
    path = check_readable(checkpoint) if checkpoint else newest_readable_checkpoint(directory, log)
    if not path:
        raise ValueError(f"no checkpoint in {directory}")
    from tfxl.backend import is_tensorflow
    if is_tensorflow():
        restore_fitting(tf.train.Checkpoint(model=model), path, fits, partial=True)
    else:  # a Keras model of another backend, read by the paths TensorFlow names it by
        from tfxl.checkpoint_tree import read_checkpoint
        read_checkpoint(path, fits, model=model)
    return path


def restore_fitting(checkpoint, path, fits, partial=False):
    """`checkpoint.restore(path)` (`partial`: read only what `checkpoint` tracks, e.g. the
    model's weights out of a training checkpoint), every object it tracks matched; ValueError
    "checkpoint … does not fit `fits`: <first line of the reason>" otherwise."""
    try:
        status = checkpoint.read(path).expect_partial() if partial else checkpoint.restore(path)
        status.assert_existing_objects_matched()
    except (tf.errors.OpError, AssertionError, ValueError) as err:
        raise ValueError(f"checkpoint {path} does not fit {fits}: "
                         f"{str(err).splitlines()[0]}") from None


def checkpoint_state_damage(directory):
    """Why the `checkpoint` state file in `directory` cannot be used (it does not read, is not
    UTF-8, does not parse, or names no checkpoint); None when it is fine or absent."""
    path = os.path.join(directory, CHECKPOINT_STATE)
    if not tf.io.gfile.exists(path):
        return None
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            text = f.read().decode("utf-8")
        from tfxl.private_apis import checkpoint_management  # TensorFlow's
        state = checkpoint_management.CheckpointState()
        text_format.Parse(text, state)
    except tf.errors.OpError as err:
        return f"cannot read it ({err.message})"
    except UnicodeDecodeError:
        return "it is not UTF-8 text"
    except text_format.ParseError as err:
        return f"it does not parse ({str(err).splitlines()[0]})"
    if not state.model_checkpoint_path:
        return "it names no checkpoint" + (" (empty)" if not text.strip() else "")
    return None


def rewrite_checkpoint_state(directory):
    """Rewrites the `checkpoint` state file of `directory` from its checkpoint files (newest
    last, each with its index file's time, so that CheckpointManager's max_to_keep still deletes
    the oldest); removes it when there is no checkpoint. Returns the checkpoint names."""
    prefixes = checkpoints_newest_first(directory)[::-1]
    if not prefixes:
        tf.io.gfile.remove(os.path.join(directory, CHECKPOINT_STATE))
        return []
    times = [tf.io.gfile.stat(f"{p}.index").mtime_nsec / 1e9 for p in prefixes]
    from tfxl.private_apis import checkpoint_management  # TensorFlow's
    checkpoint_management.update_checkpoint_state_internal(
        directory, prefixes[-1], all_model_checkpoint_paths=prefixes,
        save_relative_paths=True, all_model_checkpoint_timestamps=times,
        last_preserved_timestamp=min(times) - 1)
    return [os.path.basename(p) for p in prefixes]
