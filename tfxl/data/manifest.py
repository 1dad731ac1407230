"""The JSON manifest that describes a prepared data directory.

`tfxl-prepare` writes ``manifest.json`` last (after every shard and vocabulary
file is in place), so its presence means the directory is complete, on a local
disk (renamed into place) and on an object store like GCS (one object, written
last): readers trust the manifest and read only the files it lists (their
paths are relative to the data directory; on an object store they lie in the
run's ``gen-<id>/`` directory).  Read through `tf.io.gfile`: ``gs://`` works.
Fields (see docs/data.md for an example):

``format_version``   int, `FORMAT_VERSION`; readers refuse other versions.
``tokenizer``        the tokenizer's `spec()`: type, vocabulary file, sha256.
``vocab_size``, ``vocab_sha256``, ``pad_id``, ``eod_id``, ``is_character_level``
``cutoffs``          suggested adaptive-softmax cutoffs ([] = full softmax).
``tgt_len``          T, tokens per segment.
``num_streams``      S, streams per split.
``record``           feature names/shapes of one TFRecord (one segment),
                     `tfxl.data.records.manifest_entry`.
``source``           what was prepared (corpus/format/input files, documents).
``splits``           per split: ``tokens`` (= targets, every token of the
                     split), ``segments``, ``documents``, ``resets_inside``
                     (True when documents start inside streams), and
                     ``streams``: [{``file``, ``bytes``, ``segments``,
                     ``tokens``}] in stream order (stream s = entry s).
"""

from __future__ import annotations

import json
import os

import tensorflow as tf

from tfxl.data import storage
from tfxl.data.errors import DataError

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"


def load_manifest(data_dir: str) -> dict:
    """Reads ``data_dir/manifest.json``; a `DataError` says what is wrong."""
    path = os.path.join(data_dir, MANIFEST_NAME)
    try:
        if not tf.io.gfile.isdir(data_dir):
            raise DataError(f"data directory {data_dir} does not exist; run tfxl-prepare first")
        raw = storage.read_bytes(path)
    except tf.errors.NotFoundError:
        raise DataError(f"{path} not found: {data_dir} is not a prepared data directory "
                        "(or tfxl-prepare was interrupted); run tfxl-prepare") from None
    except (OSError, tf.errors.OpError) as e:
        raise DataError(f"cannot read {path}: {storage.reason(e, path)}") from None
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(manifest, dict):
        raise DataError(f"{path}: expected a JSON object")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise DataError(f"{path}: format_version {version!r} is not supported "
                        f"(this tfxl reads version {FORMAT_VERSION}); re-run tfxl-prepare")
    for key in ("tokenizer", "vocab_size", "vocab_sha256", "tgt_len", "num_streams", "splits"):
        if key not in manifest:
            raise DataError(f"{path}: missing field {key!r}")
    check_field_types(manifest, path)
    return manifest


# The type of every field a reader uses (a hand-edited or damaged manifest must be refused when it
# is loaded, before a job writes anything, not fail deep inside a pipeline).
_TOP_FIELDS = {"vocab_size": int, "vocab_sha256": str, "tgt_len": int, "num_streams": int,
               "pad_id": int, "eod_id": int, "is_character_level": bool, "cutoffs": [int],
               "tokenizer": dict, "splits": dict}
_SPLIT_FIELDS = {"tokens": int, "segments": int, "documents": int, "resets_inside": bool,
                 "streams": [dict]}
_STREAM_FIELDS = {"file": str, "bytes": int, "segments": int, "tokens": int}
_TYPE_NAMES = {int: "an integer", str: "a string", bool: "true or false", dict: "an object"}


def _check_fields(values: dict, fields: dict, where: str, path: str) -> None:
    for key, kind in fields.items():
        if key not in values:
            continue
        value, name = values[key], f"{where}{key}"
        items = value if isinstance(kind, list) and isinstance(value, list) else None
        if isinstance(kind, list):
            if items is None:
                raise DataError(f"{path}: field {name!r} must be a list, got {value!r}; "
                                "re-run tfxl-prepare")
            for i, item in enumerate(items):
                _check_value(item, kind[0], f"{name}[{i}]", path)
        else:
            _check_value(value, kind, name, path)


def _check_value(value, kind, name, path):
    # bool is an int to Python, not to a manifest
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise DataError(f"{path}: field {name!r} must be {_TYPE_NAMES[kind]}, got {value!r} "
                        f"({type(value).__name__}); re-run tfxl-prepare")


def check_field_types(manifest: dict, path: str = MANIFEST_NAME) -> None:
    """Raises a `DataError` naming the first field of `manifest` (and of its splits and streams)
    whose type is not the one tfxl-prepare writes."""
    _check_fields(manifest, _TOP_FIELDS, "", path)
    for split, info in manifest["splits"].items():
        _check_value(info, dict, f"splits.{split}", path)
        _check_fields(info, _SPLIT_FIELDS, f"splits.{split}.", path)
        for i, stream in enumerate(info.get("streams", [])):
            _check_fields(stream, _STREAM_FIELDS, f"splits.{split}.streams[{i}].", path)


def check_manifest(manifest: dict, *, tgt_len: int | None = None,
                   num_streams: int | None = None, vocab_sha256: str | None = None,
                   global_batch_size: int | None = None, vocab_size: int | None = None) -> None:
    """Checks training settings against the manifest before the first step.

    Each argument left as None is not checked.  `global_batch_size` must
    divide ``num_streams`` (every batch slot owns the same number of streams).
    Raises `DataError` (a `ValueError`) naming the field and both values.
    """
    def disagree(field, flag_value, manifest_value, hint):
        raise DataError(f"{field} mismatch: training uses {field}={flag_value!r} but the "
                        f"manifest has {field}={manifest_value!r}; {hint}")

    if tgt_len is not None and int(tgt_len) != manifest["tgt_len"]:
        disagree("tgt_len", tgt_len, manifest["tgt_len"],
                 "re-run tfxl-prepare with --tgt_len or change the training flag")
    if num_streams is not None and int(num_streams) != manifest["num_streams"]:
        disagree("num_streams", num_streams, manifest["num_streams"],
                 "re-run tfxl-prepare with --num_streams or change the training flag")
    if vocab_sha256 is not None and vocab_sha256 != manifest["vocab_sha256"]:
        disagree("vocab_sha256", vocab_sha256, manifest["vocab_sha256"],
                 "the model was built for a different vocabulary")
    if vocab_size is not None and int(vocab_size) != manifest["vocab_size"]:
        disagree("vocab_size", vocab_size, manifest["vocab_size"],
                 "the model was built for a different vocabulary")
    if global_batch_size is not None:
        batch, streams = int(global_batch_size), manifest["num_streams"]
        if batch <= 0 or streams % batch:
            raise DataError(f"global batch size {batch} must divide num_streams={streams} "
                            "(each batch slot reads its own streams); choose a divisor or "
                            "re-run tfxl-prepare with --num_streams")


def split_info(manifest: dict, split: str) -> dict:
    splits = manifest["splits"]
    if split not in splits:
        raise DataError(f"split {split!r} is not in the manifest "
                        f"(available: {', '.join(sorted(splits)) or 'none'})")
    return splits[split]
