"""Recorded runs: the settings that shape a training run, stored in `model_dir/run.json`.

    {"settings": {"optimizer", "weight_decay", "learning_rate", "warmup_steps", "min_lr_ratio",
                  "schedule_steps", "train_batch_size", "clip", "mixed_precision", "seed",
                  "steps_per_loop", "strategy", "replicas"},
     "history": [{"at_step", "train_steps", "time", "changed": {setting: [old, new]}}, ...]}

A job may record settings of its own beside these (tfxl-classify-train: the classifier's head
and reading, `train/tasks/classification.py`); every recorded setting is compared.

The first run writes it. A run that continues from a checkpoint compares its settings with the
recorded ones and is refused with every difference named (old and new), unless it is started with
`--allow_run_changes`: then the new settings are recorded, with the change and its step in
`history`. A run that finds no checkpoint starts at step 1 and nothing has been trained with the
recorded settings: its own replace them (said in a message, kept in `history`).

The learning-rate schedule has its own length, `schedule_steps`: `--schedule_steps`, else the
first run's `--train_steps`; a later run keeps the recorded length, so extending `--train_steps`
does not bend the curve that the steps so far followed: past `schedule_steps` the rate stays at
its final value, learning_rate * min_lr_ratio (Keras' CosineDecay holds it there). To stretch
the curve instead, give `--schedule_steps` and `--allow_run_changes` (the rate then jumps at the
restart to the new curve's value). `--train_steps` itself is not a setting: changing it is
recorded in `history`, never refused.
"""

import dataclasses
import json
import time

from absl import flags

from tfxl.files import check_fields, read_json, write_json_atomically
from tfxl.model_dir import ModelDir
from tfxl.deferred import deferred_import

tf = deferred_import("tensorflow")

__all__ = ["RunRecord", "define_flags", "run_settings"]

SETTINGS = ("optimizer", "weight_decay", "learning_rate", "warmup_steps", "min_lr_ratio",
            "schedule_steps", "train_batch_size", "clip", "mixed_precision", "seed",
            "steps_per_loop", "strategy", "replicas")


def define_flags():
    flags.DEFINE_integer("schedule_steps", None, "Length of the learning-rate schedule (warm-up "
                         "and cosine decay) in steps; past it the rate stays at its final value. "
                         "Default: the first run's --train_steps, recorded in run.json, so that a "
                         "longer --train_steps later does not bend the curve.")
    flags.DEFINE_bool("allow_run_changes", False, "Continue a run from its checkpoint with "
                      "settings that differ from those recorded in run.json (optimizer, "
                      "schedule, batch, clip, precision, seed, steps_per_loop, strategy); the "
                      "change is recorded there.")


def run_settings(opt, global_batch, mixed_precision, seed, steps_per_loop, backend):
    """The settings that shape a run ({SETTINGS}); schedule_steps None when not given. backend:
    the run's `tfxl.train.backends.Backend` (its strategy's kind and replicas)."""
    return {"optimizer": opt.optimizer, "weight_decay": opt.weight_decay,
            "learning_rate": opt.learning_rate, "warmup_steps": opt.warmup_steps,
            "min_lr_ratio": opt.min_lr_ratio, "schedule_steps": opt.schedule_steps,
            "train_batch_size": global_batch, "clip": opt.clip,
            "mixed_precision": mixed_precision, "seed": seed, "steps_per_loop": steps_per_loop,
            "strategy": backend.strategy_kind, "replicas": backend.replicas}


# run.json's fields (tfxl.files.check_fields); a setting itself may hold any JSON value (each is
# compared), except the schedule's length, which the run uses.
RECORD_FIELDS = {"settings": "object", "history": "list?"}
SETTING_FIELDS = {"schedule_steps": "count?"}
HISTORY_FIELDS = {"train_steps": "integer?"}


def read_run_record(path):
    """run.json's record; ValueError naming the file and the field when it is damaged."""
    record = read_json(path, "run record", RECORD_FIELDS)
    check_fields(record["settings"], path, "run record", SETTING_FIELDS)
    for entry in record.get("history") or []:
        if not isinstance(entry, dict):
            raise ValueError(f"run record {path} is damaged: its field 'history' must be a list "
                             f"of JSON objects, not one holding {json.dumps(entry)[:40]}")
        check_fields(entry, path, "run record (history)", HISTORY_FIELDS)
    return record


def _as_json(value):
    return json.loads(json.dumps(value))


@dataclasses.dataclass
class RunRecord:
    """What `resolve` decided: the run's `settings` (schedule_steps filled in) and what `store`
    writes (nothing when `record` is None)."""

    path: str
    settings: dict
    record: dict = None
    messages: list = dataclasses.field(default_factory=list)

    @classmethod
    def resolve(cls, model_dir, settings, train_steps, resuming, allow_changes=False):
        """Compares `settings` (run_settings) with model_dir's run.json; reads only.

        resuming: whether the run continues from a checkpoint (one is in model_dir). Raises
        ValueError naming every difference when it does and they differ, unless allow_changes.
        What the run should be told is in `messages` (the runner logs them when it starts).
        """
        messages = []
        log = messages.append
        path = ModelDir(model_dir).run
        new = _as_json(settings)
        stored = read_run_record(path) if tf.io.gfile.exists(path) else None
        old = (stored or {}).get("settings", {})
        entry = {"at_step": None, "train_steps": train_steps,
                 "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        if new["schedule_steps"] is None:  # not given: the recorded length, else this run's
            new["schedule_steps"] = (old.get("schedule_steps") if resuming and old
                                     else train_steps)
        if stored is None:
            return cls(path, new, {"settings": new, "history": [entry]}, messages)
        history = stored.get("history") or []
        changed = {k: [old.get(k), v] for k, v in new.items() if old.get(k) != v}
        listing = "; ".join(f"{k}: run.json has {a!r}, this run {b!r}"
                            for k, (a, b) in changed.items())
        if changed and resuming and not allow_changes:
            raise ValueError(
                f"--model_dir={model_dir} continues a run recorded with other settings "
                f"({listing}); use the recorded settings, or --allow_run_changes to change them "
                "from the checkpoint's step on (recorded in run.json)")
        if changed:
            log(f"run settings changed ({listing}): "
                + ("--allow_run_changes, recorded in run.json" if resuming else
                   "no checkpoint to continue, so this run's settings replace the recorded ones"))
        past = history[-1].get("train_steps") if history else None
        schedule = new["schedule_steps"]
        if resuming and train_steps > schedule and past != train_steps:
            log(f"--train_steps={train_steps} goes past the learning-rate schedule's "
                f"{schedule} steps: from step {schedule + 1} on the rate stays at its final "
                f"value, learning_rate * min_lr_ratio (to stretch the curve instead: "
                f"--schedule_steps={train_steps} --allow_run_changes)")
        if not changed and past == train_steps:
            return cls(path, new, None, messages)  # nothing new to record
        if changed:
            entry["changed"] = changed
        return cls(path, new, {"settings": new, "history": history + [entry]}, messages)

    @property
    def schedule_steps(self):
        return self.settings["schedule_steps"]

    def store(self, at_step):
        """Writes run.json when something is new (the first run, a change, a new train_steps)."""
        if self.record is not None:
            self.record["history"][-1]["at_step"] = at_step
            write_json_atomically(self.path, self.record)
            self.record = None
