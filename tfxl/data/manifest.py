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

A classification data directory (`tfxl.data.classification`) has a manifest of another
``kind`` (a language-model manifest has none): ``"kind": "classification"``, the same tokenizer
fields, ``labels`` (the label names, index = label id), ``record`` (one TFRecord = one whole
document) and per split ``documents``, ``tokens``, ``max_length``, ``class_counts`` (label name ->
documents) and ``shards``: [{``file``, ``bytes``, ``documents``}]. `load_manifest(kind=...)`
checks the kind a reader needs, then that kind's schema.
"""

from __future__ import annotations

import json
import os


from tfxl.data.errors import DataError
from tfxl.deferred import deferred_import
from tfxl.files import read_bytes, reason

tf = deferred_import("tensorflow")

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
LANGUAGE_MODEL, CLASSIFICATION = "language_model", "classification"  # the "kind" field


def data_dir_problem(data_dir: str) -> str | None:
    """Why `data_dir` cannot be a data directory ("does not exist; …", "is a file, …"), or
    None."""
    if tf.io.gfile.isdir(data_dir):
        return None
    if tf.io.gfile.exists(data_dir):
        return "is a file, not a directory; give the --output_dir of tfxl-prepare"
    return "does not exist; run tfxl-prepare first"


def manifest_kind(manifest: dict) -> str:
    """What a manifest describes: LANGUAGE_MODEL segments (no "kind" field) or CLASSIFICATION
    documents."""
    return manifest.get("kind", LANGUAGE_MODEL)


def load_manifest(data_dir: str, kind: str | None = LANGUAGE_MODEL) -> dict:
    """Reads ``data_dir/manifest.json`` of data of `kind` (None: any kind); a `DataError` says
    what is wrong."""
    path = os.path.join(data_dir, MANIFEST_NAME)
    try:
        problem = data_dir_problem(data_dir)
        if problem:
            raise DataError(f"data directory {data_dir} {problem}")
        raw = read_bytes(path)
    except tf.errors.NotFoundError:
        raise DataError(f"{path} not found: {data_dir} is not a prepared data directory "
                        "(or tfxl-prepare was interrupted); run tfxl-prepare") from None
    except (OSError, tf.errors.OpError) as e:
        raise DataError(f"cannot read {path}: {reason(e, path)}") from None
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
    found = manifest_kind(manifest)
    if found not in _SCHEMAS:
        raise DataError(f"{path}: unknown kind {found!r} (this tfxl reads "
                        f"{', '.join(_SCHEMAS)})")
    if kind is not None and found != kind:
        raise DataError(f"{path}: {data_dir} holds {found.replace('_', ' ')} data, not "
                        f"{kind.replace('_', ' ')} data; {_PREPARED_BY[kind]}")
    _SCHEMAS[found](manifest, path)
    return manifest


# The schema of every field a reader uses: {name: (type, least value or None, required)}; a list
# type is written [item type]. A hand-edited or damaged manifest is refused when it is loaded,
# with one line naming the file and the field, before a job reads a shard or writes anything
# (not deep inside a pipeline, a model or an allocation).
_TOP_FIELDS = {"tokenizer": (dict, None, True), "vocab_size": (int, 1, True),
               "vocab_sha256": (str, None, True), "pad_id": (int, 0, True),
               "eod_id": (int, 0, True), "tgt_len": (int, 1, True),
               "num_streams": (int, 1, True), "splits": (dict, None, True),
               "is_character_level": (bool, None, False), "cutoffs": ([int], 1, False)}
_TOKENIZER_FIELDS = {"type": (str, None, True), "vocab_size": (int, 1, True),
                     "vocab_sha256": (str, None, True)}
_SPLIT_FIELDS = {"tokens": (int, 0, True), "segments": (int, 0, True),
                 "streams": ([dict], None, True), "documents": (int, 0, False),
                 "resets_inside": (bool, None, False)}
_STREAM_FIELDS = {"file": (str, None, True), "bytes": (int, 0, True),
                  "segments": (int, 1, True), "tokens": (int, 0, True)}
_CLASSIFICATION_FIELDS = {"tokenizer": (dict, None, True), "vocab_size": (int, 1, True),
                          "vocab_sha256": (str, None, True), "pad_id": (int, 0, True),
                          "eod_id": (int, 0, True), "labels": ([str], None, True),
                          "splits": (dict, None, True)}
_CLASSIFICATION_SPLIT_FIELDS = {"documents": (int, 1, True), "tokens": (int, 0, True),
                                "max_length": (int, 0, True), "class_counts": (dict, None, True),
                                "shards": ([dict], None, True)}
_SHARD_FIELDS = {"file": (str, None, True), "bytes": (int, 0, True),
                 "documents": (int, 0, True)}
_TYPE_NAMES = {int: "an integer", str: "a string", bool: "true or false", dict: "an object"}


_REPREPARE = "re-run tfxl-prepare"


def _refuse(path: str, problem: str):
    raise DataError(f"{path}: {problem}; {_REPREPARE}")


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_value(value, kind, least, name, path):
    # bool is an int to Python, not to a manifest
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        _refuse(path, f"field {name!r} must be {_TYPE_NAMES[kind]}, got {_shown(value)} "
                      f"({type(value).__name__})")
    if least is not None and value < least:
        _refuse(path, f"field {name!r} must be >= {least}, got {value}")


def _check_fields(values, fields: dict, where: str, path: str) -> None:
    """Checks the object `values` (the field `where`) against `fields`, a schema above."""
    if not isinstance(values, dict):
        _refuse(path, f"field {where.rstrip('.')!r} must be an object, got {_shown(values)}")
    for key, (kind, least, required) in fields.items():
        name = f"{where}{key}"
        if key not in values:
            if required:
                _refuse(path, f"missing field {name!r}")
            continue
        value = values[key]
        if isinstance(kind, list):
            if not isinstance(value, list):
                _refuse(path, f"field {name!r} must be a list, got {_shown(value)}")
            for i, item in enumerate(value):
                _check_value(item, kind[0], least, f"{name}[{i}]", path)
        else:
            _check_value(value, kind, least, name, path)


def check_schema(manifest: dict, path: str = MANIFEST_NAME) -> None:
    """Raises a `DataError` naming the first field of `manifest` (its tokenizer, splits and
    streams included) that is missing, of another type than tfxl-prepare writes, out of range,
    or inconsistent with another field (vocab_size against its tokenizer's, the pad and eod ids
    and the cutoffs against vocab_size, the streams of a split against num_streams)."""
    _check_fields(manifest, _TOP_FIELDS, "", path)
    _check_vocabulary(manifest, path)
    V = manifest["vocab_size"]
    cutoffs = manifest.get("cutoffs", [])
    if any(a >= b for a, b in zip(cutoffs, cutoffs[1:] + [V])):
        _refuse(path, f"field 'cutoffs' must increase and stay below vocab_size {V}, got "
                      f"{_shown(cutoffs)}")
    for split, info in manifest["splits"].items():
        _check_fields(info, _SPLIT_FIELDS, f"splits.{split}.", path)
        streams = info["streams"]
        if len(streams) != manifest["num_streams"]:
            _refuse(path, f"field 'splits.{split}.streams' lists {len(streams)} streams, "
                          f"num_streams is {manifest['num_streams']}")
        for i, stream in enumerate(streams):
            _check_fields(stream, _STREAM_FIELDS, f"splits.{split}.streams[{i}].", path)


def _check_vocabulary(manifest: dict, path: str) -> None:
    """The tokenizer entry, and vocab_size and the special ids against it (both kinds)."""
    _check_fields(manifest["tokenizer"], _TOKENIZER_FIELDS, "tokenizer.", path)
    V, tokenizer = manifest["vocab_size"], manifest["tokenizer"]
    if V != tokenizer["vocab_size"]:  # the size every model, embedding and check is built for
        _refuse(path, f"field 'vocab_size' is {V} but its tokenizer ({tokenizer['type']}) has "
                      f"{tokenizer['vocab_size']} tokens")
    for key in ("pad_id", "eod_id"):
        if manifest[key] >= V:
            _refuse(path, f"field {key!r} is {manifest[key]}, outside the vocabulary [0, {V})")


def check_classification_schema(manifest: dict, path: str = MANIFEST_NAME) -> None:
    """`check_schema` for a classification manifest: its fields, the labels distinct (at least
    two), and each split's class counts naming only known labels and adding up to its
    documents."""
    try:
        _check_classification_fields(manifest, path)
    except DataError as err:  # the shared checks name tfxl-prepare; this data has its own maker
        raise DataError(str(err).replace(_REPREPARE, "re-run prepare_classification")) from None


def _check_classification_fields(manifest: dict, path: str) -> None:
    _check_fields(manifest, _CLASSIFICATION_FIELDS, "", path)
    _check_vocabulary(manifest, path)
    labels = manifest["labels"]
    if len(labels) < 2 or len(set(labels)) != len(labels):
        _refuse(path, f"field 'labels' must list at least two distinct labels, got "
                      f"{_shown(labels)}")
    for split, info in manifest["splits"].items():
        where = f"splits.{split}."
        _check_fields(info, _CLASSIFICATION_SPLIT_FIELDS, where, path)
        counts = info["class_counts"]
        unknown = sorted(set(counts) - set(labels))
        if unknown:
            _refuse(path, f"field '{where}class_counts' names labels not in 'labels': "
                          f"{_shown(unknown)}")
        for label, count in counts.items():
            _check_value(count, int, 0, f"{where}class_counts.{label}", path)
        if sum(counts.values()) != info["documents"]:
            _refuse(path, f"field '{where}class_counts' adds up to {sum(counts.values())}, "
                          f"'{where}documents' is {info['documents']}")
        for i, shard in enumerate(info["shards"]):
            _check_fields(shard, _SHARD_FIELDS, f"{where}shards[{i}].", path)


# Each kind's schema check, and what makes data of that kind.
_SCHEMAS = {LANGUAGE_MODEL: check_schema, CLASSIFICATION: check_classification_schema}
_PREPARED_BY = {LANGUAGE_MODEL: "prepare it with tfxl-prepare",
                CLASSIFICATION: "prepare it with tfxl.data.classification.prepare_classification"}


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
