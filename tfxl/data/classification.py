"""Classification data: labelled documents prepared once into TFRecords of whole documents, and
the reader that batches them for `tfxl.classification.DocumentClassifier`.

Shape glossary: B batch (documents), L padded length of a batch (a multiple of T), T segment
length of the model that reads it.

Preparing (`prepare_classification(ClassificationConfig(...))`):
* inputs (`tfxl.data.labelled`): JSON lines, CSV, or a folder per label; train, and valid/test
  either given or split off the training inputs (each document drawn with `seed`: the fractions
  hold on average, not exactly);
* the tokenizer is the language model's: a tfxl-prepare data directory's (`tokenizer_dir`, its
  vocabulary copied here with the same spec and hash) or the fixed ``bytes`` tokenizer, so token
  ids mean what they meant in pretraining; every document starts with ``<eod>``, as every
  document of a tfxl-prepare split does;
* one record per document, kept whole (no segments, no streams: the reader decides T):
  `RECORD_FEATURES`; `num_shards` files per split, documents dealt round-robin;
* the label set (sorted names, integers by value; label id = index) and per split the
  documents, tokens, longest document and per-label counts in the manifest
  (`tfxl.data.manifest`, kind "classification"), published as tfxl-prepare publishes
  (`tfxl.data.staging`: manifest last, local or gs://).

Reading (`classification_dataset`): ({"token_ids": int32 [B, L], "lengths": int32 [B]},
labels int32 [B]), right-padded with ``<pad>``, L the batch's longest document rounded up to a
multiple of T. Over-long documents are not capped unless `max_tokens` says so: memory is what
lets the model read them whole, and a step's activations do not grow with L (the classifier's
`grad_segments`); with `max_tokens` a document keeps its first `max_tokens` tokens (the
truncation baseline reads the first T), and `pad_to_max_tokens` gives every batch the same L
(static shapes for XLA and TPUs).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import TYPE_CHECKING, Dict, Optional, Sequence

import numpy as np

from tfxl.data import manifest as manifest_lib
from tfxl.data.errors import DataError
from tfxl.data.labelled import LABELLED_FORMATS, read_labelled
from tfxl.data.options import ERRORS, option
from tfxl.data.staging import open_output_dir
from tfxl.deferred import deferred_import
from tfxl.files import fsync_local

# TensorFlow, the tokenizers (TensorFlow modules) and the input pipeline are imported on first
# use: tfxl-prepare-classification's --help reads `ClassificationConfig` for its flags and should
# not wait for them (tests/test_cli_help.py).
tf = deferred_import("tensorflow")
if TYPE_CHECKING:
    from tfxl.data import tokenizers

# The reader's feature names: the keys `tfxl.classification.DocumentClassifier` reads (the data
# package knows nothing of the model; a test keeps the two equal).
TOKEN_IDS = "token_ids"
LENGTHS = "lengths"
# One record: a whole document's token ids (<eod> first) and its label id.
RECORD_FEATURES = {"token_ids": "int64 [n]", "label": "int64 []"}
SPLITS = ("train", "valid", "test")


@dataclasses.dataclass
class ClassificationConfig:
    """Everything `prepare_classification` needs (declared as tfxl-prepare's options are, so a
    command-line front end can generate its flags from the fields)."""

    output_dir: str = option(help="Output directory (local or gs://).")
    train: Sequence[str] = option((), "Training files or globs (folders: directories).")
    valid: Sequence[str] = option((), "Validation inputs (default: split off train).")
    test: Sequence[str] = option((), "Test inputs (default: split off train).")
    format: str = option("jsonl", "Input layout.", choices=LABELLED_FORMATS)
    text_field: str = option("text", "The text's JSON field or CSV column.")
    label_field: str = option("label", "The label's JSON field or CSV column.")
    tokenizer_dir: Optional[str] = option(
        None, "A tfxl-prepare data directory whose tokenizer to use (the language model's); "
        "none: the bytes tokenizer.")
    valid_fraction: float = option(0.1, "Share of the training documents drawn for valid when "
                                   "no valid inputs are given.")
    test_fraction: float = option(0.1, "Share of the training documents drawn for test when no "
                                  "test inputs are given.")
    num_shards: int = option(1, "TFRecord files per split.")
    seed: int = option(0, "Seed of the valid/test draw.")
    errors: str = option("strict", "Invalid UTF-8: strict (an error) or replace.",
                         choices=ERRORS)
    overwrite: bool = option(False, "Replace prepared data in output_dir.")


def _check(config: ClassificationConfig) -> None:
    if not config.output_dir:  # before the inputs are read, which may take long
        raise DataError("output_dir is required")
    if not config.train:
        raise DataError("train: no training inputs given")
    if config.format not in LABELLED_FORMATS:
        raise DataError(f"format: unknown format {config.format!r} (choose from "
                        f"{', '.join(LABELLED_FORMATS)})")
    if config.errors not in ERRORS:
        raise DataError(f"errors must be {' or '.join(ERRORS)}, not {config.errors!r}")
    drawn = [f for f, given in ((config.valid_fraction, config.valid),
                                (config.test_fraction, config.test)) if not given]
    if any(not 0 <= f < 1 for f in drawn) or sum(drawn) >= 1:
        raise DataError(f"valid_fraction and test_fraction must be in [0, 1) and leave "
                        f"training documents, got {config.valid_fraction}, "
                        f"{config.test_fraction}")
    if config.num_shards < 1:
        raise DataError(f"num_shards must be >= 1, got {config.num_shards}")


def _tokenizer(config: ClassificationConfig) -> tokenizers.Tokenizer:
    from tfxl.data import tokenizers

    if config.tokenizer_dir is None:
        return tokenizers.BytesTokenizer()
    manifest = manifest_lib.load_manifest(config.tokenizer_dir, kind=None)
    return tokenizers.tokenizer_from_spec(manifest["tokenizer"], config.tokenizer_dir)


def _documents(config, split, as_text):
    paths = getattr(config, split)
    return read_labelled(config.format, paths, split, config.text_field, config.label_field,
                         as_text, config.errors)


def _split_of(config: ClassificationConfig):
    """Which split each training document goes to: train, or valid/test when those are drawn
    from the training inputs (one uniform draw per document, in input order)."""
    rng = np.random.default_rng(config.seed)
    valid = 0.0 if config.valid else config.valid_fraction
    test = 0.0 if config.test else config.test_fraction

    def split_of(_):
        u = rng.random()
        return "valid" if u < valid else "test" if u < valid + test else "train"
    return split_of


def label_order(names) -> list:
    """The label names in label-id order: by value when every name is an integer ("2" before
    "10"), else by name."""
    names = set(names)
    if all(name.lstrip("-").isdigit() for name in names):
        return sorted(names, key=int)
    return sorted(names)


def _encode_record(ids: np.ndarray, label: int) -> bytes:
    def ints(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))
    return tf.train.Example(features=tf.train.Features(feature={
        "token_ids": ints(ids.tolist()), "label": ints([label])})).SerializeToString(
            deterministic=True)


def parse_record(record) -> dict:
    """A serialized document record -> {"token_ids": int64 [n], "label": int64 []}."""
    return tf.io.parse_single_example(record, {
        "token_ids": tf.io.VarLenFeature(tf.int64), "label": tf.io.FixedLenFeature([], tf.int64)})


def shard_name(split: str, index: int, count: int) -> str:
    return f"{split}.documents-{index:05d}-of-{count:05d}.tfrecord"


class _SplitWriter:
    """A split's shards (documents dealt round-robin) and its manifest entry."""

    def __init__(self, split, config, labels, staging):
        self.split, self.labels, self.staging = split, labels, staging
        self.names = [shard_name(split, i, config.num_shards) for i in range(config.num_shards)]
        self.writers = [tf.io.TFRecordWriter(os.path.join(staging.path, name))
                        for name in self.names]
        self.shard_documents = [0] * config.num_shards
        self.counts = {label: 0 for label in labels}
        self.documents = self.tokens = self.max_length = 0

    def write(self, ids: np.ndarray, label: str) -> None:
        shard = self.documents % len(self.writers)
        self.writers[shard].write(_encode_record(ids, self.labels.index(label)))
        self.shard_documents[shard] += 1
        self.counts[label] += 1
        self.documents += 1
        self.tokens += ids.size
        self.max_length = max(self.max_length, int(ids.size))

    def close_files(self) -> None:
        for writer in self.writers:
            writer.close()

    def entry(self, inputs) -> dict:
        """The manifest's `splits.<split>` entry, once the files are closed."""
        if self.documents == 0:
            raise DataError(f"split {self.split!r} got no documents (from "
                            f"{', '.join(inputs)}); give more documents or set its fraction to 0")
        shards = []
        for name, documents in zip(self.names, self.shard_documents):
            path = os.path.join(self.staging.path, name)
            fsync_local(path)
            shards.append({"file": self.staging.listed(name), "documents": documents,
                           "bytes": tf.io.gfile.stat(path).length})
        return {"documents": self.documents, "tokens": self.tokens,
                "max_length": self.max_length, "class_counts": self.counts,
                "input_files": list(inputs)[:1000], "shards": shards}


def prepare_classification(config: ClassificationConfig, log=None) -> dict:
    """Prepares labelled documents into `config.output_dir`; returns the manifest. Raises
    `DataError` (a ValueError) naming the file and line of a bad input, before anything is
    published."""
    from tfxl.data import tokenizers

    log = log or (lambda message: print(message, file=sys.stderr))
    _check(config)
    tokenizer = _tokenizer(config)
    as_text = tokenizer.reads_text
    # Pass 1: the label set, from every training input (also the documents drawn off for
    # valid/test), so that a label id means the same in every split.
    labels = label_order({doc.label for doc in _documents(config, "train", as_text)})
    if len(labels) < 2:
        raise DataError(f"train: {len(labels)} label{'s' * (len(labels) != 1)} in "
                        f"{', '.join(config.train)}; classification needs at least two")
    staging = open_output_dir(config.output_dir, config.overwrite)
    try:
        staging.create()
        splits = _write_splits(config, tokenizer, labels, staging)
        spec = tokenizers.with_spec_files(tokenizer.save(staging.path), staging.listed)
        manifest = {
            "format_version": manifest_lib.FORMAT_VERSION, "kind": manifest_lib.CLASSIFICATION,
            "created_by": "tfxl.data.classification", "tokenizer": spec,
            "vocab_size": tokenizer.vocab_size, "vocab_sha256": spec["vocab_sha256"],
            "pad_id": tokenizer.pad_id, "eod_id": tokenizer.eod_id,
            "is_character_level": tokenizer.is_character_level, "labels": labels,
            "record": {"type": "tf.train.Example", "compression": None,
                       "features": RECORD_FEATURES},
            "source": {"format": config.format, "text_field": config.text_field,
                       "label_field": config.label_field, "tokenizer_dir": config.tokenizer_dir,
                       # A fraction only where it drew its split (a given file: None).
                       "valid_fraction": None if config.valid else config.valid_fraction,
                       "test_fraction": None if config.test else config.test_fraction,
                       "seed": config.seed,
                       "errors": config.errors},
            "splits": splits,
        }
        files = [shard["file"] for split in splits.values() for shard in split["shards"]]
        staging.commit(files + tokenizers.spec_files(spec), manifest)
    except BaseException:
        staging.discard()
        raise
    for split, info in splits.items():
        log(f"{split}: {info['documents']} documents, {info['tokens']} tokens, "
            f"{info['class_counts']}")
    return manifest


def _write_splits(config, tokenizer, labels, staging) -> Dict[str, dict]:
    """Pass 2: every document tokenised (``<eod>`` first) into its split's shards."""
    drawn = [s for s in ("valid", "test")
             if not getattr(config, s) and getattr(config, f"{s}_fraction") > 0]
    names = ["train"] + [s for s in ("valid", "test") if getattr(config, s) or s in drawn]
    writers = {s: _SplitWriter(s, config, labels, staging) for s in names}
    split_of = _split_of(config)

    def encode(document):
        return np.concatenate([[tokenizer.eod_id], tokenizer.encode(document.text)]).astype(
            np.int64)

    try:
        for document in _documents(config, "train", tokenizer.reads_text):
            writers[split_of(document)].write(encode(document), document.label)
        for split in ("valid", "test"):
            for document in _documents(config, split, tokenizer.reads_text):
                if document.label not in labels:
                    raise DataError(f"{document.where}: label {document.label!r} is not one "
                                    f"of the training labels ({', '.join(labels)})")
                writers[split].write(encode(document), document.label)
    finally:
        for writer in writers.values():
            writer.close_files()
    return {s: writers[s].entry(getattr(config, s) or config.train) for s in names}


# ---------------------------------------------------------------------------------- reading
def load_classification_manifest(data_dir: str) -> dict:
    """A classification data directory's manifest, schema checked (`DataError` otherwise)."""
    return manifest_lib.load_manifest(data_dir, kind=manifest_lib.CLASSIFICATION)


def classification_dataset(data_dir: str, split: str, batch_size: int, segment_len: int, *,
                           shuffle: bool = False, seed: int = 0,
                           max_tokens: Optional[int] = None, pad_to_max_tokens: bool = False,
                           drop_remainder: bool = False, verify: bool = True,
                           manifest: Optional[dict] = None, repeat: bool = False,
                           skip: int = 0) -> tf.data.Dataset:
    """Batches of a split: ({"token_ids": int32 [B, L], "lengths": int32 [B]}, labels int32 [B])
    (module docstring). Every document once per pass, in shard order unless `shuffle`.

    repeat: pass after pass without end (each pass shuffled anew when `shuffle`; a batch may
    span two passes). skip: documents of that stream left out first, before any is parsed: the
    position of a resumed training run, which sees the batches an uninterrupted one would have
    (the stream is a function of `seed` alone).

    Before the dataset is built its shards are checked as `input_fn` checks its own
    (`verify_shards`: each file's size, and with `verify` every record's CRC and the count), so a
    damaged shard is a `DataError` naming it, not an error inside a step.
    """
    from tfxl.data.pipeline import pipeline_options, verify_shards

    manifest = manifest or load_classification_manifest(data_dir)
    info = manifest_lib.split_info(manifest, split)
    if segment_len < 1 or batch_size < 1:
        raise DataError(f"segment_len and batch_size must be >= 1, got {segment_len}, "
                        f"{batch_size}")
    if pad_to_max_tokens and not max_tokens:
        raise DataError("pad_to_max_tokens needs max_tokens")
    verify_shards(data_dir, info["shards"], crc=verify, records="documents")
    files = [os.path.join(data_dir, shard["file"]) for shard in info["shards"]]
    dataset = tf.data.TFRecordDataset(files)
    if shuffle:
        dataset = dataset.shuffle(min(info["documents"], 10_000), seed=seed,
                                  reshuffle_each_iteration=True)
    if repeat:
        dataset = dataset.repeat()
    if skip:
        dataset = dataset.skip(skip)

    def example(record):
        parsed = parse_record(record)
        ids = tf.cast(tf.sparse.to_dense(parsed["token_ids"]), tf.int32)
        if max_tokens:
            ids = ids[:max_tokens]
        return {TOKEN_IDS: ids, LENGTHS: tf.size(ids)}, tf.cast(parsed["label"], tf.int32)

    def to_segment_multiple(features, labels):
        pad = (-tf.shape(features[TOKEN_IDS])[1]) % segment_len
        ids = tf.pad(features[TOKEN_IDS], [[0, 0], [0, pad]], constant_values=manifest["pad_id"])
        return {TOKEN_IDS: ids, LENGTHS: features[LENGTHS]}, labels

    length = -(-max_tokens // segment_len) * segment_len if pad_to_max_tokens else None
    dataset = dataset.map(example, num_parallel_calls=tf.data.AUTOTUNE).padded_batch(
        batch_size, padded_shapes=({TOKEN_IDS: [length], LENGTHS: []}, []),
        padding_values=({TOKEN_IDS: manifest["pad_id"], LENGTHS: 0}, 0),
        drop_remainder=drop_remainder)
    dataset = dataset.map(to_segment_multiple)
    if not repeat:
        # Its length, which the TFRecord reader hides: Keras reads an unknown length's end as
        # "Your input ran out of data" (a warning at the end of every epoch of a fit).
        documents = max(info["documents"] - skip, 0)
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(
            documents // batch_size if drop_remainder else -(-documents // batch_size)))
    return dataset.with_options(pipeline_options()).prefetch(tf.data.AUTOTUNE)
