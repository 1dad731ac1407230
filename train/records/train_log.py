"""The run's own history: one JSON line per step (step, loss, grad_norm, learning_rate), each step
once, also after restarts.

The log is a set of parts, `model_dir/train_log/<first>-<last>.jsonl` (tfxl/model_dir.py), each
holding steps first..last and written once, whole (tfxl.files.write_text_atomically: a renamed
temporary file, or one object write on a bucket). Nothing is ever appended: an object store can
only append by rewriting the whole object, which would make a long run's log cost O(steps²).

* Writing (`TrainLog`, a train action of the controller): the lines of each host loop are kept in
  memory and written as a part when `flush_seconds` have passed since the last part
  (`--train_log_seconds`, default 60; 0: after every host loop), before every
  checkpoint save (so the lines of the steps a checkpoint holds are stored before it is) and when
  the run ends or fails. After a save, the parts written since the previous save are merged into
  one (from memory; up to MERGE_LINES lines, beyond which they stay as they are): a run leaves
  about one part per checkpoint.
* Resuming (`resume_train_log`, before the first step): the restored checkpoint's step S is where
  the log continues. Parts of steps after S (logged by a run killed after its last checkpoint, or
  before its first) are deleted, a part straddling S is rewritten to end at S, parts inside
  another part's range (an interrupted merge) are deleted. Each
  rewrite is written before what it replaces is deleted, so a run killed in between leaves
  duplicates of identical lines, which the next resume removes and the reader ignores.
* Reading (`read_train_log(model_dir)`): the records of every part, one per step, in step order;
  lines that do not parse are skipped.
"""

import json
import time

from absl import flags

from tfxl.files import field_error, write_text_atomically
from tfxl.model_dir import ModelDir
from tfxl.deferred import deferred_import

tf = deferred_import("tensorflow")

__all__ = ["TrainLog", "define_flags", "read_train_log", "resume_train_log"]

FLUSH_SECONDS = 60.0
MERGE_LINES = 100_000  # the lines kept in memory to merge the parts of one checkpoint interval
# A line's fields (tfxl.files.field_error); a line with another shape is not a record.
RECORD_FIELDS = {"step": "count", "loss": "real?", "grad_norm": "real?",
                 "learning_rate": "real?"}


def define_flags():
    flags.DEFINE_float("train_log_seconds", FLUSH_SECONDS, "Write the train log's new lines "
                       "after a host loop once this many seconds have passed since the last "
                       "write (0: after every host loop); they are also written before every "
                       "checkpoint and at the end. Each write is a new part under "
                       "model_dir/train_log/.")


def _lines(records):
    return "".join(json.dumps(record) + "\n" for record in records)


def _read_records(path):
    """The records of one log file; lines that are not a JSON object with a step >= 1 and numbers
    (or null) for loss, grad_norm and learning_rate (a partial last line of a killed append, a
    damaged line) are skipped."""
    with tf.io.gfile.GFile(path, "rb") as f:
        raw = f.read()
    records = []
    for line in raw.splitlines():
        try:
            record = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(record, dict) and field_error(record, RECORD_FIELDS) is None:
            records.append(record)
    return records


def read_train_log(model_dir):
    """The train log of `model_dir`: one record per step, in step order ([] when there is none).

    Where two files hold the same step (only after an interrupted rewrite, with identical lines)
    the part later in step order wins.
    While a trainer runs, a part it merges away after the listing is skipped (a later read finds
    its lines in the merged part).
    """
    layout = ModelDir(model_dir)
    by_step = {}
    for _, _, path in layout.train_log_part_list():
        try:
            by_step.update((r["step"], r) for r in _read_records(path))
        except tf.errors.NotFoundError:  # merged away by a running trainer since the listing
            continue
    return [by_step[step] for step in sorted(by_step)]


def _write_part(layout, records):
    path = layout.train_log_part(records[0]["step"], records[-1]["step"])
    tf.io.gfile.makedirs(layout.train_log_parts)
    write_text_atomically(path, _lines(records))
    return path


def resume_train_log(model_dir, step, log=print):
    """Makes the log of `model_dir` end at `step` (the restored checkpoint's; 0 with none), before
    a run writes its first line; see the module docstring. Says through `log` which steps it
    dropped."""
    layout = ModelDir(model_dir)
    dropped = []  # the steps after `step` that were logged
    parts = layout.train_log_part_list()
    for first, last, path in parts:
        if last <= step:
            continue
        records = _read_records(path)
        dropped += [r["step"] for r in records if r["step"] > step]
        kept = [r for r in records if r["step"] <= step]
        if kept and first <= step:
            _write_part(layout, kept)
        tf.io.gfile.remove(path)
    parts = layout.train_log_part_list()
    for first, last, path in parts:  # inside another part's range: left by an interrupted merge
        if any((a, b) != (first, last) and a <= first and last <= b for a, b, _ in parts):
            tf.io.gfile.remove(path)
    if dropped:
        log(f"train log: dropped steps {min(dropped)}..{max(dropped)}, logged after the "
            f"checkpoint of step {step} by a run that stopped before its next one"
            if step else f"train log: dropped steps {min(dropped)}..{max(dropped)}: there is no "
            "checkpoint to continue from, so training starts again at step 1")


class TrainLog:
    """The controller's train action that logs every step (see the module docstring).

    Args:
      model_dir: where the parts go.
      flush_seconds: write a part after a host loop once this long has passed since the last one
        (0: after every loop); parts are also written before every checkpoint save (`flush`),
        and when the run ends (`close`).
      clock: seconds, for the flush interval (tests).
    """

    def __init__(self, model_dir, flush_seconds=FLUSH_SECONDS, clock=time.monotonic):
        self.layout = ModelDir(model_dir)
        self.flush_seconds, self.clock = flush_seconds, clock
        self._pending = []    # records not written yet
        self._unmerged = []   # [(path, records)] of the parts written since the last checkpoint
        self._last_write = clock()

    def __call__(self, outputs):
        self._pending += [
            {"step": outputs["first_step"] + i + 1, "loss": float(loss),
             "grad_norm": float(norm), "learning_rate": float(lr)}
            for i, (loss, norm, lr) in enumerate(zip(
                outputs["loss"], outputs["grad_norm"], outputs["learning_rate"]))]
        if self.clock() - self._last_write >= self.flush_seconds:
            self.flush()

    def flush(self, step=None):
        """Writes the lines not written yet as one part (a checkpoint's before-save hook)."""
        del step
        if self._pending:
            records, self._pending = self._pending, []
            self._unmerged.append((_write_part(self.layout, records), records))
            if sum(len(part) for _, part in self._unmerged) > MERGE_LINES:
                self._unmerged = []  # a long checkpoint interval: its parts stay as they are
        self._last_write = self.clock()

    def merge(self, step=None):
        """Merges the parts written since the last checkpoint into one (an after-save hook): the
        new part is written before the small ones are deleted."""
        del step
        if len(self._unmerged) > 1:
            records = [r for _, part in self._unmerged for r in part]
            merged = _write_part(self.layout, records)
            for path, _ in self._unmerged:
                if path != merged:
                    tf.io.gfile.remove(path)
        self._unmerged = []

    def close(self):
        self.flush()
