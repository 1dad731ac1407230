"""The layout of a tfxl-train model_dir and of an export's tfxl record: every name in one place.

    model_dir/
      config.json              the model (TransfoXLConfig), written by the first run
      data.json                the data it was trained on: its kind, which says the kind of run
                               (RUN_KINDS), and its vocabulary (sha256, size, tgt_len, data_dir)
      run.json                 the settings that shape the run, their history
      (train/records/run_record.py)
      lease.json               the live trainer's lease, renewed while it runs
      (train/records/lease.py)
      train_log/<first>-<last>.jsonl   one JSON line per step, in parts written once
                               (train/records/train_log.py; steps as 10-digit numbers)
      metrics.json             the results of the run that trained it
      checkpoints/ckpt-N       training checkpoints (tfxl/checkpoints/training.py)
      checkpoints/checkpoint   TensorFlow's checkpoint state file (a cache: the files are listed)
      tmp_worker_checkpoints/  MultiWorkerMirrored workers' own copies (not the chief's)
      train/                   TensorBoard scalars
      classifier.keras         a tfxl-classify-train run's classifier, written when it finishes
    <export version>/assets.extra/tfxl_data.json    vocabulary size and hash of an export
    <export version>/saved_model.pb     what a SavedModel loader opens first: published last
                                        (tfxl.files.StagedDirectory); a version without it is
                                        incomplete and never loaded

Every path may be a bucket (`gs://...`): everything here goes through tf.io.gfile. The trainer
(tfxl.train), serving (tfxl.serving), the keras-hub converter and the demo read and write a
model_dir through this module only; it imports no trainer, serving or data code.
"""

import os
import re


from tfxl.config import TransfoXLConfig
from tfxl.files import read_json, write_json_atomically
from tfxl.deferred import deferred_import

tf = deferred_import("tensorflow")

CONFIG = "config.json"
DATA = "data.json"
RUN = "run.json"
LEASE = "lease.json"
TRAIN_LOG_PARTS = "train_log"
TRAIN_LOG_PART = re.compile(r"^(\d{10})-(\d{10})\.jsonl$")  # <first step>-<last step>.jsonl
METRICS = "metrics.json"
CHECKPOINTS = "checkpoints"
CHECKPOINT_STATE = "checkpoint"  # TensorFlow's name, inside CHECKPOINTS
WORKER_CHECKPOINTS = "tmp_worker_checkpoints"
TENSORBOARD = "train"
# TF Serving ignores assets.extra: the export's tfxl record lives there.
EXPORT_RECORD = os.path.join("assets.extra", "tfxl_data.json")
SAVED_MODEL = "saved_model.pb"
CLASSIFIER = "classifier.keras"

# The kinds of run a model_dir holds, by the kind of data trained on as data.json records it (the
# data manifest's "kind", tfxl.data.manifest): {kind: (the tool that trains it, what it trains)}.
# Every tool that reads a model_dir checks its kind first (`check_run_kind`): a classifier's
# checkpoints given to a language model's tool would otherwise fail deep in their loading, or on
# a setting that is not the cause.
RUN_KINDS = {"language_model": ("tfxl-train", "a language model"),
             "classification": ("tfxl-classify-train", "a document classifier")}
LANGUAGE_MODEL, CLASSIFICATION = RUN_KINDS

# The names of a model_dir that are directories, and those that are files (`check_layout`).
DIRECTORIES = (CHECKPOINTS, TRAIN_LOG_PARTS, TENSORBOARD, WORKER_CHECKPOINTS)
FILES = (CONFIG, DATA, RUN, LEASE, METRICS, os.path.join(CHECKPOINTS, CHECKPOINT_STATE))
# The fields of the records read here (tfxl.files.check_fields): data.json (and an export's
# record), metrics.json (what a finished run reports: its step at least).
DATA_FIELDS = {"kind": "text?", "vocab_sha256": "text?", "vocab_size": "count?",
               "tgt_len": "count?", "data_dir": "text?"}
METRICS_FIELDS = {"step": "integer"}


class ModelDir:
    """The paths of one model_dir (a local directory or a bucket prefix)."""

    def __init__(self, path):
        self.path = path

    def _join(self, *names):
        return os.path.join(self.path, *names)

    config = property(lambda self: self._join(CONFIG))
    data = property(lambda self: self._join(DATA))
    run = property(lambda self: self._join(RUN))
    lease = property(lambda self: self._join(LEASE))
    train_log_parts = property(lambda self: self._join(TRAIN_LOG_PARTS))
    metrics = property(lambda self: self._join(METRICS))
    checkpoints = property(lambda self: self._join(CHECKPOINTS))
    checkpoint_state = property(lambda self: self._join(CHECKPOINTS, CHECKPOINT_STATE))
    tensorboard = property(lambda self: self._join(TENSORBOARD))
    classifier = property(lambda self: self._join(CLASSIFIER))

    def train_log_part(self, first, last):
        """The part of the train log that holds steps first..last."""
        return self._join(TRAIN_LOG_PARTS, f"{first:010d}-{last:010d}.jsonl")

    def train_log_part_list(self):
        """[(first, last, path)] of the train log's parts, in step order (temporary files and
        other names are not parts)."""
        if not tf.io.gfile.isdir(self.train_log_parts):
            return []
        parts = []
        for name in tf.io.gfile.listdir(self.train_log_parts):
            match = TRAIN_LOG_PART.match(name.rstrip("/"))
            if match:
                parts.append((int(match.group(1)), int(match.group(2)),
                              self._join(TRAIN_LOG_PARTS, match.group(0))))
        return sorted(parts)

    def worker_checkpoints(self, worker_id):
        """Where a MultiWorkerMirrored worker other than the chief saves (only the chief's
        checkpoints are kept; every worker must save for the collective save to complete)."""
        return self._join(WORKER_CHECKPOINTS, str(worker_id))

    def check_layout(self):
        """Refuses (ValueError naming it) a model_dir that is a file, or whose entry is of
        another kind than the trainer makes it (`checkpoints` a file, `run.json` a directory):
        the trainer would find no checkpoint and start again, deleting the train log, and fail
        at its first save, so this is checked before anything is written or removed."""
        if tf.io.gfile.exists(self.path) and not tf.io.gfile.isdir(self.path):
            raise ValueError(f"--model_dir={self.path} is a file, not a directory")
        for names, want_directory in ((DIRECTORIES, True), (FILES, False)):
            for name in names:
                path = self._join(name)
                if tf.io.gfile.exists(path) and tf.io.gfile.isdir(path) != want_directory:
                    found, wanted = (("a file", "directory") if want_directory
                                     else ("a directory", "file"))
                    raise ValueError(f"{path} is {found}, not the {wanted} a training run "
                                     f"keeps there; move it out of --model_dir={self.path}")

    def is_model_dir(self):
        """Whether a training run has claimed it (config.json written)."""
        return tf.io.gfile.exists(self.config)


def run_kind(model_dir):
    """The kind of run (a key of RUN_KINDS) that trained `model_dir`, as its data.json records
    it; None when there is no data.json (no run has claimed the model_dir)."""
    path = ModelDir(model_dir).data
    if not tf.io.gfile.exists(path):
        return None
    stored = read_json(path, "data fingerprint", DATA_FIELDS)
    kind = stored.get("kind")
    if kind is None:  # a data.json without it: a classification data dir has no segment length
        kind = LANGUAGE_MODEL if stored.get("tgt_len") is not None else CLASSIFICATION
    if kind not in RUN_KINDS:
        raise ValueError(f"data fingerprint {path} is damaged: its field 'kind' must be one of "
                         f"{', '.join(RUN_KINDS)}, not {kind!r}")
    return kind


def check_run_kind(model_dir, kind, advice, flag=None):
    """Refuses a model_dir that another kind of run than `kind` (a key of RUN_KINDS) trained:
    ValueError "`flag`=`model_dir` is a tfxl-classify-train run (a document classifier), not a
    tfxl-train run; `advice`". A model_dir that records no kind passes (`run_kind`)."""
    found = run_kind(model_dir)
    if found is None or found == kind:
        return
    tool, what = RUN_KINDS[found]
    name = f"{flag}={model_dir}" if flag else model_dir
    raise ValueError(f"{name} is a {tool} run ({what}), not a {RUN_KINDS[kind][0]} run; "
                     f"{advice}")


def check_or_store_config(model_dir, config, store=True, kind=LANGUAGE_MODEL):
    """Refuses a model_dir of another kind of run (`check_run_kind`) or trained with another
    model; `store` writes config.json into a new one.

    The trainer checks early (store=False) and stores only once every other check has passed
    (`claim`).
    """
    path = ModelDir(model_dir).config
    if tf.io.gfile.exists(model_dir) and not tf.io.gfile.isdir(model_dir):
        raise ValueError(f"--model_dir={model_dir} is a file, not a directory")
    check_run_kind(model_dir, kind, f"give {RUN_KINDS[kind][0]} another --model_dir",
                   flag="--model_dir")
    if tf.io.gfile.exists(path):
        stored = TransfoXLConfig.from_file(path).to_dict()
        wanted = config.to_dict()
        diff = {k: (stored.get(k), wanted.get(k)) for k in sorted(set(stored) | set(wanted))
                if stored.get(k) != wanted.get(k)}
        if diff:
            listing = ", ".join(f"{k}: model_dir has {a!r}, flags give {b!r}"
                                for k, (a, b) in diff.items())
            raise ValueError(f"--model_dir={model_dir} holds a different model ({listing}); "
                             "use a new --model_dir or the same model flags")
    elif store:
        tf.io.gfile.makedirs(model_dir)
        write_json_atomically(path, config.to_dict())


def claim(model_dir, config, manifest, data_dir):
    """Writes config.json and data.json (or checks them): every other check has passed.

    A model_dir is claimed only once every check of a first run has passed, so a run refused for
    a bad flag leaves nothing that would refuse the corrected command.
    """
    check_or_store_config(model_dir, config)
    check_data_fingerprint(model_dir, manifest, data_dir, store=True)


# Which vocabulary a model belongs to: the one check shared by every tool that pairs a model with
# a data directory (tfxl-train, tfxl-eval, tfxl-export, tfxl-generate, tfxl.hub). The first
# training run stores the manifest's vocabulary hash in data.json; an export made with a
# tokenizer stores it in its EXPORT_RECORD. Another vocabulary of the same size would silently
# give wrong text, so it is refused, as is another size.

def check_data_fingerprint(model_dir, manifest, data_dir, store=False):
    """Refuses data whose vocabulary differs from the one `model_dir` was trained (or exported)
    with; `store=True` records the manifest's when nothing is recorded yet (first training run).

    model_dir: a tfxl-train model_dir (data.json) or an export version directory.
    """
    path = ModelDir(model_dir).data
    if not tf.io.gfile.exists(path):
        path = os.path.join(model_dir, EXPORT_RECORD)
    if tf.io.gfile.exists(path):
        stored = read_json(path, "data fingerprint", DATA_FIELDS)
        recorded = stored.get("vocab_sha256")  # None: an export made without a tokenizer
        if recorded is not None and recorded != manifest["vocab_sha256"]:
            raise ValueError(
                f"--data_dir={data_dir} has another vocabulary (sha256 "
                f"{manifest['vocab_sha256'][:12]}...) than the one {model_dir} was trained on "
                f"({recorded[:12]}..., from {stored.get('data_dir')})")
    elif store:
        write_json_atomically(ModelDir(model_dir).data, {
            "kind": manifest.get("kind", LANGUAGE_MODEL),  # as tfxl.data.manifest.manifest_kind
            "vocab_sha256": manifest["vocab_sha256"], "vocab_size": manifest["vocab_size"],
            # A classification data dir has no segment length (its records are whole documents).
            "tgt_len": manifest.get("tgt_len"), "data_dir": data_dir})


def check_vocab_size(manifest, data_dir, vocab_size, model):
    """A model over V ids cannot use a vocabulary of another size (vocab_size None: unknown)."""
    if vocab_size is not None and manifest["vocab_size"] != vocab_size:
        raise ValueError(f"--data_dir={data_dir} has a vocabulary of {manifest['vocab_size']} "
                         f"tokens but {model} was built for {vocab_size}")


def write_export_record(export_dir, vocab_size, vocab_sha256=None, data_dir=None, **more):
    """Records inside an export its vocabulary size and, when it embeds a tokenizer, the
    tokenizer's hash; `more`: what the signatures add (a classifier's label names, index =
    class id)."""
    path = os.path.join(export_dir, EXPORT_RECORD)
    tf.io.gfile.makedirs(os.path.dirname(path))
    write_json_atomically(path, {"vocab_sha256": vocab_sha256, "vocab_size": vocab_size,
                                 "data_dir": data_dir, **more})


def export_vocab_size(export_dir):
    """The vocabulary size an export recorded, or None (exports of older tfxl versions)."""
    path = os.path.join(export_dir, EXPORT_RECORD)
    return (read_json(path, "export record", DATA_FIELDS).get("vocab_size")
            if tf.io.gfile.exists(path) else None)
