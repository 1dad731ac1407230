r"""`tfxl-prepare`: a corpus -> a tokenizer and sharded TFRecords of fixed-length segments, with
a manifest (docs/data.md: every format, tokenizer and option).

    tfxl-prepare --corpus=python_stdlib --output_dir=data/stdlib
    tfxl-prepare --format=enwik8 --train=enwik8.zip --tgt_len=512 --num_streams=24 \
        --output_dir=data/enwik8
    tfxl-prepare --format=wikitext --train=wiki.train.tokens --valid=wiki.valid.tokens \
        --test=wiki.test.tokens --tgt_len=150 --num_streams=64 --output_dir=data/wt103

Every path may be a bucket (gs://...). The manifest is written last, so a reader never sees a
half-written data directory; an existing one is replaced only with --overwrite. On a terminal,
each pass shows a progress bar.
"""

from __future__ import annotations

if __name__ == "__main__":  # `python -m`: TensorFlow quiet before the imports below load it
    from tfxl.cli.quiet import quiet_tensorflow
    quiet_tensorflow()

import dataclasses
import os
import sys
import time
from typing import TYPE_CHECKING, Iterator, List, Optional

import numpy as np
from absl import flags

from tfxl import cli
from tfxl.data import manifest as manifest_lib
from tfxl.data import records
from tfxl.data.errors import DataError
from tfxl.data.formats import DOCUMENTS, FORMATS, get_format
from tfxl.data.options import (DEFAULT_TGT_LEN, ERRORS, STDLIB_MAX_EVAL_BYTES,
                               STDLIB_MAX_TRAIN_BYTES, STDLIB_TGT_LEN, TOKENIZER_NAMES,
                               PrepareConfig, VocabularyOptions, define_flags_of, from_flags)
from tfxl.data.segments import TokenReader, iter_segments, shard_name, stream_bounds
from tfxl.data.sources import CORPORA, capped, piece_bytes, split_pieces
from tfxl.data.staging import open_output_dir
from tfxl.deferred import deferred_import
from tfxl.files import fsync_local, local_path

# TensorFlow, Keras and the tokenizers (TensorFlow modules) are imported on first use: --help
# reads this module for its flags and should not wait for them (tests/test_cli_help.py).
keras = deferred_import("keras")
tf = deferred_import("tensorflow")
if TYPE_CHECKING:
    from tfxl.data import tokenizers

# How tfxl-prepare works. Pipeline (bounded memory: nothing holds a whole split, only ~1 MB
# chunks, one lm1b file while it is shuffled, and the vocabulary counters):
#
# 1. Sources (`tfxl.data.sources`): each split is a list of byte ranges of files;
#    the corpus format (`tfxl.data.formats`: text, enwik8, text8, wikitext, lm1b,
#    jsonl) turns them into documents, each a stream of text chunks.  Or the
#    embedded ``--corpus=python_stdlib``.
# 2. Tokenizer (`tfxl.data.tokenizers`): learned from the training split
#    (chars/words/wordpiece, sentencepiece with --sentencepiece_vocab_size), or fixed.
# 3. Tokenise each split into a flat temporary token file on a local disk (next to the
#    staged output, or in TMPDIR when the output is on an object store); ``<eod>`` is
#    written before every document (before the whole split when documents are not kept).
# 4. Cut the token sequence into S contiguous streams and each stream into
#    segments of T targets (`tfxl.data.segments`); write one TFRecord file per
#    stream, one record per segment (`tfxl.data.records`).
# 5. Write vocabulary and manifest, the manifest last (`tfxl.data.staging`: on a local
#    disk everything is renamed into place; on an object store such as GCS the files go to
#    a fresh ``gen-<id>/`` directory and the manifest naming them is written after them;
#    either way a killed prepare never leaves a manifest pointing at partial shards).
#
# Every path a user gives (inputs, --output_dir, --sentencepiece_model) goes through
# `tf.io.gfile` (`tfxl.files`): ``gs://`` works wherever a local path does.
#
# On a terminal, each pass shows a Keras progress bar with rate and ETA (on stdout; the
# log lines go to stderr); nothing of it when stdout is not a terminal.


# The least value of each numeric option that has one (-1 for the byte caps: -1 is their
# default cap, 0 none); tgt_len, num_streams and sentencepiece_vocab_size are checked once
# resolved.
_LEAST = {"max_train_bytes": -1, "max_eval_bytes": -1, "min_freq": 1, "max_size": 0,
          "wordpiece_vocab_size": 1, "wordpiece_sample_bytes": 1}


def _resolve(config: PrepareConfig) -> PrepareConfig:
    for name, least in _LEAST.items():
        if getattr(config, name) < least:
            raise DataError(f"--{name}={getattr(config, name)} is out of range: it must be "
                            f">= {least}")
    config = dataclasses.replace(config)
    if config.corpus is not None and config.corpus not in CORPORA:
        raise DataError(f"--corpus: unknown corpus {config.corpus!r} "
                        f"(choose from {', '.join(CORPORA)})")
    if config.corpus and (config.train or config.valid or config.test):
        raise DataError("--corpus and --train/--valid/--test are mutually exclusive")
    corpus_format = get_format(config.format)
    if config.corpus == "python_stdlib":
        config.format = "text"
        corpus_format = get_format(config.format)
        config.tokenizer = config.tokenizer or "bytes"
        config.tgt_len = STDLIB_TGT_LEN if config.tgt_len is None else config.tgt_len
        if config.max_train_bytes < 0:
            config.max_train_bytes = STDLIB_MAX_TRAIN_BYTES
        if config.max_eval_bytes < 0:
            config.max_eval_bytes = STDLIB_MAX_EVAL_BYTES
    config.tokenizer = config.tokenizer or corpus_format.default_tokenizer
    config.tgt_len = DEFAULT_TGT_LEN if config.tgt_len is None else config.tgt_len
    config.max_train_bytes = max(0, config.max_train_bytes)
    config.max_eval_bytes = max(0, config.max_eval_bytes)
    if config.tokenizer not in TOKENIZER_NAMES:
        raise DataError(f"--tokenizer: unknown tokenizer {config.tokenizer!r} "
                        f"(choose from {', '.join(TOKENIZER_NAMES)})")
    if config.errors not in ERRORS:
        raise DataError(f"--errors must be {' or '.join(ERRORS)}, not {config.errors!r}")
    if config.documents == "auto":
        config.documents = "file" if corpus_format.keeps_documents else "none"
    if config.documents not in DOCUMENTS[1:]:
        raise DataError(f"--documents must be auto, none or file, not {config.documents!r}")
    if config.tgt_len < 1:
        raise DataError(f"--tgt_len must be >= 1, got {config.tgt_len}")
    if config.num_streams < 1:
        raise DataError(f"--num_streams must be >= 1, got {config.num_streams}")
    _check_sentencepiece_flags(config)
    return config


def _check_sentencepiece_flags(config: PrepareConfig) -> None:
    given = config.sentencepiece_model, config.sentencepiece_vocab_size
    if config.tokenizer != "sentencepiece":
        if any(v is not None for v in given):
            raise DataError("--sentencepiece_model and --sentencepiece_vocab_size need "
                            "--tokenizer=sentencepiece")
        return
    if all(v is None for v in given):
        raise DataError("--tokenizer=sentencepiece needs --sentencepiece_model=PATH or "
                        "--sentencepiece_vocab_size=N (learn one from the training split)")
    if all(v is not None for v in given):
        raise DataError("--sentencepiece_model and --sentencepiece_vocab_size are mutually "
                        "exclusive (use a ready model, or learn one)")
    if config.sentencepiece_vocab_size is not None and config.sentencepiece_vocab_size < 1:
        raise DataError(f"--sentencepiece_vocab_size must be >= 1, got "
                        f"{config.sentencepiece_vocab_size}")


def prepare(config: PrepareConfig, log=print, progress: Optional[bool] = None) -> dict:
    """Runs the whole preparation; returns the manifest.  Raises `DataError`.

    progress: show progress bars (rate, ETA) on stdout; None: when stdout is a terminal.
    """
    from tfxl.data.tokenizers import TOKENIZERS

    config = _resolve(config)
    text = TOKENIZERS[config.tokenizer].reads_text
    # Check inputs (existence, readability, flags) before touching the output.
    pieces = split_pieces(config.train, config.valid, config.test, FORMATS[config.format], text,
                          config.seed, config.corpus)
    missing = [name for name in ("valid", "test") if name not in pieces]
    if missing:  # a format that keeps its files whole (wikitext, lm1b) does not cut --train
        log(f"note: no {' or '.join(missing)} split: --format={config.format} does not cut its "
            f"--train files; tfxl-train evaluates on valid, tfxl-eval reads a split by name: "
            f"add {' and '.join(f'--{name}=FILE' for name in missing)}")
    caps = {"train": config.max_train_bytes, "valid": config.max_eval_bytes,
            "test": config.max_eval_bytes}
    pieces = {name: capped(p, caps[name]) for name, p in pieces.items()}
    staging = open_output_dir(config.output_dir, config.overwrite)
    if progress is None:
        progress = hasattr(sys.stdout, "isatty") and sys.stdout.isatty()
    try:
        staging.create()
        return _prepare_into(config, pieces, staging, log, progress)
    except BaseException as err:
        scratch = staging.scratch
        staging.discard()
        # Inputs were checked above: what fails here is writing (read-only, full disk, quota).
        if (isinstance(err, OSError) and scratch and scratch != staging.path
                and str(err.filename or "").startswith(local_path(scratch))):
            # The token scratch files of an object-store prepare are on the local disk.
            raise DataError(f"cannot write the scratch token file {err.filename} of "
                            f"--output_dir {config.output_dir}: {err.strerror or err} (set "
                            "TMPDIR to a local disk with room for the largest split's tokens, "
                            "2 or 4 bytes each)") from None
        if isinstance(err, OSError):
            raise DataError(f"cannot write into --output_dir {config.output_dir}: "
                            f"{err.strerror or err} ({err.filename or staging.path})") from None
        if isinstance(err, tf.errors.OpError):
            raise DataError(f"cannot write into --output_dir {config.output_dir}: "
                            f"{err.message}") from None
        raise


class _Progress:
    """A Keras progress bar (rate and ETA) of one pass, or nothing when not `shown`.

    `total` items (bytes, tokens) are shown in units of `scale` items named `unit`.
    """

    def __init__(self, label: str, total: int, unit: str, shown: bool, scale: int = 1):
        if shown:
            print(label, flush=True)
        self.scale, self.done = scale, 0
        self.bar = keras.utils.Progbar(max(1, -(-total // scale)), verbose=1 if shown else 0,
                                       unit_name=unit)

    def add(self, count: int) -> None:
        self.done += count
        # A pass may read a little more than estimated (or less): the end is `finish`'s.
        self.bar.update(min(self.done // self.scale, self.bar.target - 1))

    def finish(self) -> None:
        self.bar.update(self.bar.target, finalize=True)


def _input_bytes(pieces) -> int:
    return sum(piece_bytes(p) for p in pieces)


def _prepare_into(config, pieces, staging, log, progress) -> dict:
    """The steps of a prepare whose inputs and output directory were checked: learn the
    tokenizer; per split, tokenise into a scratch file, then cut it into one shard per stream;
    write the vocabulary and the manifest (`staging` puts them in place, manifest last)."""
    from tfxl.data.tokenizers import TOKENIZERS

    started = time.time()
    corpus_format = FORMATS[config.format]

    def documents(split):
        return corpus_format.documents(pieces.get(split, []), config.documents == "file",
                                       TOKENIZERS[config.tokenizer].reads_text, config.errors)

    tokenizer = _learn_tokenizer(config, pieces.get("train", []), documents, log, progress)
    dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.int32
    files, splits = [], {}
    train_counts = np.zeros(tokenizer.vocab_size, np.int64)
    for split, inputs in pieces.items():
        tokens = _tokenize_split(split, inputs, documents(split), tokenizer, dtype,
                                 staging.scratch, progress,
                                 train_counts if split == "train" else None)
        _check_split_size(split, inputs, tokens.num_targets, config)
        streams = _write_shards(split, tokens, tokenizer, config, staging, progress)
        tf.io.gfile.remove(tokens.path)
        files += [stream["file"] for stream in streams]
        splits[split] = _split_entry(inputs, tokens, streams, config)
        log(f"{split}: {tokens.num_targets} tokens, {splits[split]['segments']} segments in "
            f"{config.num_streams} streams")
    manifest = _write_vocabulary_and_manifest(config, tokenizer, train_counts, splits, files,
                                              staging)
    input_bytes = sum(split["input_bytes"] for split in splits.values())
    seconds = time.time() - started
    log(f"wrote {config.output_dir}: {input_bytes / 1e6:.1f} MB in {seconds:.1f} s "
        f"({input_bytes / 1e6 / max(seconds, 1e-9):.2f} MB/s)")
    return manifest


def _learn_tokenizer(config, train_pieces, documents, log, progress) -> tokenizers.Tokenizer:
    """Step 2: the tokenizer, learned from the training split (or fixed: bytes, a given
    SentencePiece model)."""
    from tfxl.data import tokenizers
    from tfxl.data.tokenizers import TOKENIZERS

    tokenizer_class = TOKENIZERS[config.tokenizer]

    def training_text() -> Iterator:
        bar = _Progress(f"train: reading for the {config.tokenizer} vocabulary",
                        _input_bytes(train_pieces), "kB", progress, scale=1000)
        try:
            for document in documents("train"):
                for chunk in document:
                    bar.add(len(chunk))
                    yield chunk
        finally:
            bar.finish()

    if tokenizer_class is not tokenizers.BytesTokenizer and not config.sentencepiece_model:
        log(f"building the {config.tokenizer} vocabulary from the training split")
    return tokenizer_class.learn(training_text, VocabularyOptions.of(config))


@dataclasses.dataclass
class _TokenFile:
    """A split tokenised into a flat scratch file of `dtype` ids: positions 0..total-1, an
    ``<eod>`` at each of `doc_starts`."""

    path: str
    dtype: type
    doc_starts: List[int]
    total: int
    input_bytes: int

    @property
    def num_targets(self) -> int:
        return self.total - len(self.doc_starts)  # every position but the <eod>s is a target


def _tokenize_split(split, inputs, documents, tokenizer, dtype, scratch, progress,
                    counts=None) -> _TokenFile:
    """Step 3: a split's documents -> a flat token file in the local directory `scratch`,
    ``<eod>`` before each document; `counts` (train) adds up every id's count, for the suggested
    cutoffs. (Plain file calls: scratch is prepare's own, always on a local disk.)"""
    text = tokenizer.reads_text
    bar = _Progress(f"{split}: tokenizing", _input_bytes(inputs), "kB", progress, scale=1000)
    path = os.path.join(local_path(scratch), f"{split}.tokens.bin")
    tokens = _TokenFile(path, dtype, [], 0, 0)
    with open(tokens.path, "wb") as out:
        for document in documents:
            tokens.doc_starts.append(tokens.total)
            out.write(np.array([tokenizer.eod_id], dtype).tobytes())
            tokens.total += 1
            for chunk in document:
                size = len(chunk) if not text else len(chunk.encode("utf-8"))
                tokens.input_bytes += size
                bar.add(size)
                ids = tokenizer.encode(chunk)
                # (file.write, not ndarray.tofile: a full disk is ENOSPC, not a count)
                out.write(ids.astype(dtype, copy=False).tobytes())
                tokens.total += ids.size
                if counts is not None:
                    counts += np.bincount(ids, minlength=tokenizer.vocab_size)[
                        :tokenizer.vocab_size]
    bar.finish()
    return tokens


def _check_split_size(split, inputs, num_targets, config) -> None:
    """A split must fill at least one segment per stream."""
    T, S = config.tgt_len, config.num_streams
    where = ", ".join(p.label for p in inputs[:3]) + (" ..." if len(inputs) > 3 else "")
    if num_targets == 0:
        raise DataError(f"split {split!r} is empty (no tokens in {where or 'no files'})")
    if num_targets < S * T:
        raise DataError(f"split {split!r} has {num_targets} tokens, fewer than one segment "
                        f"per stream (--num_streams={S} x --tgt_len={T} = {S * T}); "
                        "lower --num_streams or --tgt_len, or give more data")


def _write_shards(split, tokens, tokenizer, config, staging, progress) -> List[dict]:
    """Step 4: the token file cut into S streams of segments, one TFRecord shard per stream
    in `staging.path` (any file system); returns the manifest's `streams` entries."""
    T, S = config.tgt_len, config.num_streams
    bar = _Progress(f"{split}: writing {S} shards", tokens.num_targets, "token", progress)
    reader = TokenReader(tokens.path, tokens.dtype)
    starts = np.asarray(tokens.doc_starts, np.int64)
    bounds = stream_bounds(tokens.total, S)
    streams = []
    for s in range(S):
        name = shard_name(split, s, S)
        path = os.path.join(staging.path, name)
        segments = targets = 0
        with tf.io.TFRecordWriter(path) as writer:
            for ids, reset in iter_segments(reader, bounds[s], bounds[s + 1], starts, T):
                writer.write(records.encode(ids, T, tokenizer.pad_id, reset, s, segments))
                segments += 1
                targets += ids.size - 1
                bar.add(ids.size - 1)
        if segments == 0:
            raise DataError(f"split {split!r}: stream {s} has no tokens (too many empty "
                            "documents for --num_streams); lower --num_streams")
        fsync_local(path)
        streams.append({"file": staging.listed(name), "bytes": tf.io.gfile.stat(path).length,
                        "segments": segments, "tokens": targets})
    bar.finish()
    assert sum(stream["tokens"] for stream in streams) == tokens.num_targets
    return streams


def _split_entry(inputs, tokens, streams, config) -> dict:
    """The manifest's `splits.<split>` entry."""
    return {
        "tokens": tokens.num_targets, "segments": sum(s["segments"] for s in streams),
        "documents": len(tokens.doc_starts), "input_bytes": tokens.input_bytes,
        "resets_inside": bool(config.documents == "file" and len(tokens.doc_starts) > 1),
        "input_files": [p.label for p in inputs][:1000],
        "streams": streams,
    }


def _write_vocabulary_and_manifest(config, tokenizer, train_counts, splits, files,
                                   staging) -> dict:
    """Step 5: the vocabulary file(s) and the manifest; `staging.commit` publishes them, the
    manifest last (`tfxl.data.staging`: renamed into place on a local disk, written after every
    file it names on an object store)."""
    from tfxl.data import tokenizers

    spec = tokenizers.with_spec_files(tokenizer.save(staging.path), staging.listed)
    manifest = {
        "format_version": manifest_lib.FORMAT_VERSION,
        "created_by": "tfxl-prepare",
        "tokenizer": spec,
        "vocab_size": tokenizer.vocab_size,
        "vocab_sha256": spec["vocab_sha256"],
        "pad_id": tokenizer.pad_id,
        "eod_id": tokenizer.eod_id,
        "is_character_level": tokenizer.is_character_level,
        "cutoffs": suggest_cutoffs(train_counts, tokenizer.frequency_ordered),
        "tgt_len": config.tgt_len,
        "num_streams": config.num_streams,
        "record": records.manifest_entry(config.tgt_len),
        "source": {"corpus": config.corpus, "format": config.format,
                   "documents": config.documents, "errors": config.errors,
                   "seed": config.seed, "max_train_bytes": config.max_train_bytes,
                   "max_eval_bytes": config.max_eval_bytes},
        "splits": splits,
    }
    staging.commit(files + tokenizers.spec_files(spec), manifest)
    return manifest


def suggest_cutoffs(counts: np.ndarray, frequency_ordered: bool) -> List[int]:
    """Cutoffs where the training-token coverage of ids [0, c) reaches 80% and 95%.

    Only meaningful for frequency-ordered vocabularies of some size (words);
    [] (a full softmax) otherwise.
    """
    if not frequency_ordered or counts.size < 2000 or counts.sum() == 0:
        return []
    coverage = np.cumsum(counts) / counts.sum()
    cutoffs = []
    for level in (0.8, 0.95):
        cut = int(np.searchsorted(coverage, level) + 1)
        cut = min(counts.size - 1, max(8, (cut + 7) // 8 * 8))
        if (not cutoffs or cut > cutoffs[-1]) and cut < counts.size - 1:
            cutoffs.append(cut)
    return cutoffs


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------
def define_flags(flag_values=flags.FLAGS) -> None:
    """Registers the tfxl-prepare flags (only when the CLI runs, never on import): one per
    `PrepareConfig` field, generated from it (`tfxl.data.options`)."""
    define_flags_of(PrepareConfig, flag_values, module_name=__name__)


def config_from_flags(flag_values) -> PrepareConfig:
    return from_flags(PrepareConfig, flag_values)


def main(argv, flag_values=flags.FLAGS):
    """tfxl-prepare on parsed flags (`flag_values`: another FlagValues in in-process tests); a
    DataError is the user's: tfxl/cli/runner.py prints its one `error:` line and exits 2."""
    del argv  # stray arguments are refused by tfxl/cli/runner.py
    prepare(config_from_flags(flag_values), log=lambda msg: print(msg, file=sys.stderr))
    return 0


def run():
    """Console-script entry point (`tfxl-prepare`)."""
    cli.run(main, define_flags)


if __name__ == "__main__":
    run()
