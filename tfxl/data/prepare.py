"""`tfxl-prepare`: corpus -> tokenizer -> sharded TFRecords of fixed-length segments.

Pipeline (bounded memory: nothing holds a whole split, only ~1 MB chunks, one
lm1b file while it is shuffled, and the vocabulary counters):

1. Sources: each split is a list of documents, each a list of byte ranges of
   files (``FilePiece``).  Formats: text, enwik8, text8, wikitext, lm1b, and
   the embedded ``--corpus=python_stdlib``.
2. Vocabulary (chars/words/wordpiece): one pass over the training split.
3. Tokenise each split into a flat temporary token file; ``<eod>`` is written
   before every document (before the whole split when documents are not kept).
4. Cut the token sequence into S contiguous streams and each stream into
   segments of T targets; write one TFRecord file per stream.
5. Write vocabulary and manifest; move everything into place (manifest last).

Record layout (one `tf.train.Example` per segment, all int64):
``tokens`` [T+1] (inputs = tokens[:T], targets = tokens[1:]; pad after the
segment's real tokens), ``length`` (number of real targets, 1..T), ``reset``
(1 when the segment starts a stream or a document), ``stream`` (s) and
``position`` (segment index inside the stream).

Atomicity: everything is written into ``output_dir/.tmp-prepare-<pid>/``;
at the end the old manifest (with --overwrite) is removed first, files are
renamed into place, and the manifest is renamed into place last.  A killed
prepare therefore never leaves a manifest pointing at partial shards.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import hashlib
import json
import os
import shutil
import sys
import sysconfig
import time
import zipfile
from typing import Iterator, List, Optional, Sequence

import numpy as np

from tfxl.data import manifest as manifest_lib
from tfxl.data.errors import DataError

FORMATS = ("text", "enwik8", "text8", "wikitext", "lm1b")
TOKENIZERS = ("bytes", "chars", "words", "wordpiece", "sentencepiece")
CORPORA = ("python_stdlib",)
SPLITS = ("train", "valid", "test")
DEFAULT_TOKENIZER = {"text": "bytes", "enwik8": "bytes", "text8": "chars",
                     "wikitext": "words", "lm1b": "words"}
# The paper's enwik8/text8 split: the last 5M bytes are test, the 5M before valid.
PAPER_EVAL_BYTES = 5_000_000
CHUNK_BYTES = 1 << 20
TMP_PREFIX = ".tmp-prepare-"
# python_stdlib demo corpus defaults (keep `make demo` quick on 2 CPU cores).
STDLIB_TGT_LEN = 64
STDLIB_MAX_TRAIN_BYTES = 4 << 20
STDLIB_MAX_EVAL_BYTES = 256 << 10


@dataclasses.dataclass
class PrepareConfig:
    """Everything `prepare` needs; the CLI flags map onto these fields 1:1."""

    output_dir: str
    train: Sequence[str] = ()
    valid: Sequence[str] = ()
    test: Sequence[str] = ()
    corpus: Optional[str] = None
    format: str = "text"
    tokenizer: Optional[str] = None          # None: per-format default
    sentencepiece_model: Optional[str] = None
    min_freq: int = 1
    max_size: int = 0
    wordpiece_vocab_size: int = 8000
    wordpiece_sample_bytes: int = 32 << 20
    tgt_len: Optional[int] = None            # None: 64 for python_stdlib, else 512
    num_streams: int = 16
    documents: str = "auto"                  # auto | none | file
    max_train_bytes: int = -1                # -1: per-corpus default, 0: no cap
    max_eval_bytes: int = -1
    overwrite: bool = False
    errors: str = "strict"
    seed: int = 0


# ---------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------
@dataclasses.dataclass
class FilePiece:
    """Bytes [start, end) of a file (or of a zip member)."""

    path: str
    start: int = 0
    end: Optional[int] = None
    member: Optional[str] = None
    shuffle_lines: bool = False   # lm1b: shuffle this file's sentences
    shuffle_seed: int = 0

    @property
    def label(self) -> str:
        return f"{self.path}:{self.member}" if self.member else self.path

    def open(self):
        if self.member:
            handle = zipfile.ZipFile(self.path).open(self.member)
            _skip(handle, self.start)
            return handle
        handle = open(self.path, "rb")
        handle.seek(self.start)
        return handle


def _skip(handle, count: int) -> None:
    while count > 0:
        block = handle.read(min(count, CHUNK_BYTES))
        if not block:
            break
        count -= len(block)


def _expand(flag: str, patterns: Sequence[str]) -> List[str]:
    """Files named by a flag's comma-separated paths/globs, checked readable."""
    paths = []
    for pattern in patterns:
        if any(ch in pattern for ch in "*?["):
            matches = sorted(glob.glob(pattern))
            if not matches:
                raise DataError(f"--{flag}: no files match {pattern!r}")
            paths.extend(matches)
        else:
            paths.append(pattern)
    for path in paths:
        if not os.path.exists(path):
            raise DataError(f"--{flag}: file not found: {path}")
        if os.path.isdir(path):
            raise DataError(f"--{flag}: {path} is a directory, expected a file or glob")
        try:
            with open(path, "rb") as f:
                f.read(1)
        except OSError as e:
            raise DataError(f"--{flag}: cannot read {path}: {e.strerror}") from None
    return paths


def _whole_file_piece(path: str, fmt: str) -> FilePiece:
    """enwik8.zip/text8.zip are read through their single member."""
    if fmt in ("enwik8", "text8") and zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            names = [i.filename for i in archive.infolist() if not i.is_dir()]
        if not names:
            raise DataError(f"{path}: zip archive is empty")
        member = fmt if fmt in names else names[0]
        return FilePiece(path, member=member)
    return FilePiece(path)


def _piece_size(piece: FilePiece) -> int:
    if piece.member:
        with zipfile.ZipFile(piece.path) as archive:
            return archive.getinfo(piece.member).file_size
    return os.path.getsize(piece.path)


def _next_line_start(piece: FilePiece, pos: int, size: int) -> int:
    """A split point near `pos` that cuts neither a line nor a UTF-8 character.

    The first line start within 1 MiB after `pos`; without a newline there
    (text8 is a single line), the first character boundary at or after `pos`.
    """
    if pos <= 0 or pos >= size:
        return pos
    handle = dataclasses.replace(piece, start=pos).open()
    try:
        block = handle.read(CHUNK_BYTES)
    finally:
        handle.close()
    newline = block.find(b"\n")
    if newline >= 0:
        return pos + newline + 1
    skip = 0
    while skip < min(3, len(block)) and (block[skip] & 0xC0) == 0x80:
        skip += 1
    return pos + skip


def _stdlib_files() -> List[str]:
    """Sorted *.py files of the running Python's standard library (no site-packages)."""
    root = sysconfig.get_paths()["stdlib"]
    found = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs
                            if d not in ("site-packages", "dist-packages", "__pycache__"))
        found.extend(os.path.join(directory, f) for f in sorted(files) if f.endswith(".py"))
    return sorted(found, key=lambda p: os.path.relpath(p, root))


def stdlib_split_of(relative_path: str) -> str:
    """Deterministic ~90/5/5 split by a hash of the path relative to the stdlib root."""
    bucket = int(hashlib.sha256(relative_path.encode("utf-8")).hexdigest(), 16) % 100
    return "train" if bucket < 90 else ("valid" if bucket < 95 else "test")


def _capped(pieces: List[FilePiece], cap: int) -> List[FilePiece]:
    """Leading pieces up to `cap` bytes in total (the last one truncated)."""
    if cap <= 0:
        return pieces
    out, total = [], 0
    for piece in pieces:
        size = (piece.end if piece.end is not None else _piece_size(piece)) - piece.start
        if total + size >= cap:
            out.append(dataclasses.replace(piece, end=piece.start + (cap - total)))
            break
        out.append(piece)
        total += size
    return out


def _split_pieces(config: PrepareConfig, text_tokenizer: bool) -> dict:
    """split name -> list of FilePiece, in corpus order."""
    if config.corpus == "python_stdlib":
        root = sysconfig.get_paths()["stdlib"]
        splits = {s: [] for s in SPLITS}
        for path in _stdlib_files():
            splits[stdlib_split_of(os.path.relpath(path, root))].append(FilePiece(path))
        return splits

    train = _expand("train", config.train)
    valid = _expand("valid", config.valid)
    test = _expand("test", config.test)
    if not train:
        raise DataError("--train is required (or --corpus=python_stdlib)")
    if not valid and not test and len(train) == 1 and config.format in ("text", "enwik8", "text8"):
        # One file: the paper's split (last 5M test, previous 5M valid); smaller
        # files keep the same 90/5/5 proportions.
        piece = _whole_file_piece(train[0], config.format)
        size = _piece_size(piece)
        eval_bytes = min(PAPER_EVAL_BYTES, size // 20)
        cut_valid, cut_test = size - 2 * eval_bytes, size - eval_bytes
        if text_tokenizer:
            cut_valid = _next_line_start(piece, cut_valid, size)
            cut_test = max(cut_valid, _next_line_start(piece, cut_test, size))
        return {"train": [dataclasses.replace(piece, end=cut_valid)],
                "valid": [dataclasses.replace(piece, start=cut_valid, end=cut_test)],
                "test": [dataclasses.replace(piece, start=cut_test, end=size)]}
    out = {}
    for name, paths in (("train", train), ("valid", valid), ("test", test)):
        if paths:
            out[name] = [_whole_file_piece(p, config.format) for p in paths]
    if config.format == "lm1b":
        for split_index, name in enumerate(out):
            out[name] = [dataclasses.replace(p, shuffle_lines=True,
                                             shuffle_seed=hash_seed(config.seed, split_index, i))
                         for i, p in enumerate(out[name])]
    return out


def hash_seed(*parts) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little")


def _documents(pieces: List[FilePiece], keep_documents: bool) -> List[List[FilePiece]]:
    return [[p] for p in pieces] if keep_documents else [pieces]


# ---------------------------------------------------------------------------
# Chunked, validated reading
# ---------------------------------------------------------------------------
def _chunk_cut(block: bytes) -> int:
    """Where to cut a block so that no line, word or UTF-8 character is split."""
    newline = block.rfind(b"\n")
    if newline >= 0:
        return newline + 1
    space = max(block.rfind(bytes([c])) for c in b" \t\r\x0b\x0c")
    if space >= 0:
        return space + 1
    cut = len(block)
    # Back over UTF-8 continuation bytes (at most 3) to a character boundary.
    while cut > 0 and len(block) - cut < 3 and (block[cut - 1] & 0xC0) == 0x80:
        cut -= 1
    if cut > 0 and block[cut - 1] >= 0xC0:
        cut -= 1
    return cut or len(block)


def _raw_chunks(piece: FilePiece, whole_lines: bool) -> Iterator[tuple]:
    """Yields (bytes, byte offset in the file) of about CHUNK_BYTES each."""
    try:
        handle = piece.open()
    except (OSError, zipfile.BadZipFile, KeyError) as e:
        raise DataError(f"cannot read {piece.label}: {getattr(e, 'strerror', None) or e}") from None
    with handle:
        remaining = None if piece.end is None else piece.end - piece.start
        offset, carry = piece.start, b""
        while True:
            want = CHUNK_BYTES if remaining is None else min(CHUNK_BYTES, remaining)
            try:
                block = handle.read(want) if want > 0 else b""
            except OSError as e:
                raise DataError(f"cannot read {piece.label}: {e.strerror}") from None
            if remaining is not None:
                remaining -= len(block)
            data = carry + block
            if not block:
                if data:
                    yield data, offset
                return
            cut = _chunk_cut(data) if whole_lines else len(data)
            yield data[:cut], offset
            offset += cut
            carry = data[cut:]


def _decode(data: bytes, label: str, offset: int, errors: str) -> str:
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as e:
        raise DataError(f"{label}: invalid UTF-8 at byte offset {offset + e.start} "
                        "(pass --errors=replace to substitute U+FFFD, or use --tokenizer=bytes)"
                        ) from None


def iter_document_chunks(document: List[FilePiece], text: bool, errors: str) -> Iterator:
    """Yields chunks of one document: bytes (byte tokenizer) or validated str."""
    for piece in document:
        if piece.shuffle_lines:
            data = b"".join(chunk for chunk, _ in _raw_chunks(piece, whole_lines=False))
            if text:
                data = _decode(data, piece.label, piece.start, errors).encode("utf-8")
            lines = data.splitlines(keepends=True)
            if lines and not lines[-1].endswith(b"\n"):
                lines[-1] += b"\n"
            order = np.random.default_rng(piece.shuffle_seed).permutation(len(lines))
            # Re-chunk the shuffled sentences (whole lines, about CHUNK_BYTES each).
            batch, size = [], 0
            for index in order:
                batch.append(lines[index])
                size += len(lines[index])
                if size >= CHUNK_BYTES:
                    joined = b"".join(batch)
                    yield joined.decode("utf-8") if text else joined
                    batch, size = [], 0
            if batch:
                joined = b"".join(batch)
                yield joined.decode("utf-8") if text else joined
            continue
        for chunk, offset in _raw_chunks(piece, whole_lines=text):
            yield _decode(chunk, piece.label, offset, errors) if text else chunk


# ---------------------------------------------------------------------------
# Tokenizer construction
# ---------------------------------------------------------------------------
def build_tokenizer(config: PrepareConfig, kind: str, train_documents, log=print):
    from tfxl.data import tokenizers  # pylint: disable=import-outside-toplevel

    text = kind != "bytes"
    if kind == "bytes":
        return tokenizers.BytesTokenizer()
    if kind == "sentencepiece":
        if not config.sentencepiece_model:
            raise DataError("--tokenizer=sentencepiece needs --sentencepiece_model=PATH")
        if not os.path.isfile(config.sentencepiece_model):
            raise DataError(f"--sentencepiece_model: file not found: {config.sentencepiece_model}")
        return tokenizers.SentencePieceTokenizer.from_file(config.sentencepiece_model)
    log(f"building the {kind} vocabulary from the training split")
    if kind == "chars":
        counts = collections.Counter()
        for document in train_documents:
            for chunk in iter_document_chunks(document, text, config.errors):
                counts.update(chunk)
        return tokenizers.CharsTokenizer.build(counts, config.min_freq, config.max_size)
    if kind == "words":
        counts = collections.Counter()
        for document in train_documents:
            for chunk in iter_document_chunks(document, text, config.errors):
                counts.update(chunk.encode("utf-8").split())
        return tokenizers.WordsTokenizer.build(counts, config.min_freq, config.max_size)
    if kind == "wordpiece":
        lines, size = [], 0
        for document in train_documents:
            for chunk in iter_document_chunks(document, text, config.errors):
                lines.extend(chunk.splitlines())
                size += len(chunk)
                if size >= config.wordpiece_sample_bytes:
                    break
            if size >= config.wordpiece_sample_bytes:
                break
        return tokenizers.WordPieceTokenizer.learn(lines, config.wordpiece_vocab_size)
    raise DataError(f"--tokenizer: unknown tokenizer {kind!r} (choose from {', '.join(TOKENIZERS)})")


def _encoder(tokenizer):
    """chunk (bytes or str) -> int array, using each tokenizer's fastest exact path."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    if tokenizer.kind == "bytes":
        return lambda chunk: np.frombuffer(chunk, dtype=np.uint8)
    if tokenizer.kind == "words":
        return lambda chunk: tokenizer.encode_bytes(chunk.encode("utf-8"))
    if tokenizer.kind == "chars":
        return tokenizer.encode
    # wordpiece/sentencepiece: the tensorflow-text op on the chunk's lines at once.
    return lambda chunk: tokenizer.tf_encode(tf.constant([chunk]))[0].numpy()


# ---------------------------------------------------------------------------
# Segmentation
# ---------------------------------------------------------------------------
class _TokenReader:
    """Reads [start, stop) of the flat token file through a block cache."""

    BLOCK = 1 << 20

    def __init__(self, path: str, dtype):
        self.path, self.dtype = path, np.dtype(dtype)
        self.block_start, self.block = 0, np.zeros(0, self.dtype)

    def read(self, start: int, stop: int) -> np.ndarray:
        if start < self.block_start or stop > self.block_start + self.block.size:
            count = max(self.BLOCK, stop - start)
            self.block = np.fromfile(self.path, dtype=self.dtype, count=count,
                                     offset=start * self.dtype.itemsize)
            self.block_start = start
        return self.block[start - self.block_start:stop - self.block_start]


def stream_bounds(total_positions: int, num_streams: int) -> List[int]:
    """Cut points c_0..c_S; stream s covers positions [c_s, c_{s+1}] (one shared token).

    The token at c_{s+1} is stream s's last target and stream s+1's first
    input, so targets (c_s, c_{s+1}] partition all positions but the first.
    """
    last = total_positions - 1
    return [round(s * last / num_streams) for s in range(num_streams + 1)]


def iter_segments(reader: _TokenReader, first: int, last: int, doc_starts: np.ndarray,
                  tgt_len: int):
    """Yields (tokens [len+1], reset) for the stream covering positions [first, last].

    A segment has up to T targets and never crosses a document start: the
    ``<eod>`` at a document start is only ever an input, so a new document
    starts a new segment with reset=1 (the previous one is padded).
    """
    position, reset = first, 1
    while position < last:
        following = np.searchsorted(doc_starts, position, side="right")
        next_doc = int(doc_starts[following]) if following < doc_starts.size else None
        end = min(position + tgt_len, last)
        if next_doc is not None and next_doc <= last:
            end = min(end, next_doc - 1)
        if end > position:
            yield reader.read(position, end + 1), reset
            reset = 0
        if next_doc is not None and end == next_doc - 1:
            position, reset = next_doc, 1
        else:
            position = end


def _example(tokens: np.ndarray, tgt_len: int, pad_id: int, reset: int, stream: int,
             position: int) -> bytes:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    padded = np.full(tgt_len + 1, pad_id, dtype=np.int64)
    padded[:tokens.size] = tokens

    def ints(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))

    return tf.train.Example(features=tf.train.Features(feature={
        "tokens": ints(padded.tolist()), "length": ints([tokens.size - 1]),
        "reset": ints([reset]), "stream": ints([stream]), "position": ints([position]),
    })).SerializeToString()


def shard_name(split: str, stream: int, num_streams: int) -> str:
    return f"{split}-stream-{stream:05d}-of-{num_streams:05d}.tfrecord"


# ---------------------------------------------------------------------------
# Suggested adaptive-softmax cutoffs
# ---------------------------------------------------------------------------
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
# Output directory handling
# ---------------------------------------------------------------------------
def _prepare_output_dir(output_dir: str, overwrite: bool) -> tuple:
    """Validates --output_dir; returns (created, old manifest or None)."""
    if not output_dir:
        raise DataError("--output_dir is required")
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise DataError(f"--output_dir {output_dir} exists and is not a directory")
    created = False
    if not os.path.isdir(output_dir):
        try:
            os.makedirs(output_dir)
        except OSError as e:
            raise DataError(f"--output_dir: cannot create {output_dir}: {e.strerror}") from None
        created = True
    # Leftovers of a killed prepare are not data; remove them.
    for entry in os.listdir(output_dir):
        if entry.startswith(TMP_PREFIX):
            shutil.rmtree(os.path.join(output_dir, entry), ignore_errors=True)
    entries = [e for e in os.listdir(output_dir) if not e.startswith(TMP_PREFIX)]
    if entries and not overwrite:
        raise DataError(f"--output_dir {output_dir} is not empty; pass --overwrite to replace "
                        "its prepared data")
    old = None
    if entries:
        try:
            old = manifest_lib.load_manifest(output_dir)
        except DataError:
            old = None
    return created, old


def _finalize(tmp_dir: str, output_dir: str, files: List[str], manifest: dict,
              old_manifest: Optional[dict]) -> None:
    """Moves files into place, manifest last; then removes the old data's leftovers."""
    manifest_path = os.path.join(output_dir, manifest_lib.MANIFEST_NAME)
    # Staged first: from the removal of the old manifest on, only renames follow (no new space).
    staged = os.path.join(tmp_dir, manifest_lib.MANIFEST_NAME)
    with open(staged, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    if os.path.exists(manifest_path):
        os.remove(manifest_path)   # from here on the directory is "not prepared"
    for name in files:
        os.replace(os.path.join(tmp_dir, name), os.path.join(output_dir, name))
    os.replace(staged, manifest_path)
    if old_manifest:
        keep = set(files) | {manifest_lib.MANIFEST_NAME}
        for name in _manifest_files(old_manifest):
            if name not in keep and os.path.isfile(os.path.join(output_dir, name)):
                os.remove(os.path.join(output_dir, name))


def _manifest_files(manifest: dict) -> List[str]:
    names = [s["file"] for split in manifest.get("splits", {}).values()
             for s in split.get("streams", [])]
    spec = manifest.get("tokenizer", {})
    names += [spec[k] for k in ("vocab_file", "model_file") if spec.get(k)]
    return [n for n in names if n and os.path.basename(n) == n]


# ---------------------------------------------------------------------------
# prepare()
# ---------------------------------------------------------------------------
def _resolve(config: PrepareConfig) -> PrepareConfig:
    config = dataclasses.replace(config)
    if config.corpus is not None and config.corpus not in CORPORA:
        raise DataError(f"--corpus: unknown corpus {config.corpus!r} (choose from {', '.join(CORPORA)})")
    if config.corpus and (config.train or config.valid or config.test):
        raise DataError("--corpus and --train/--valid/--test are mutually exclusive")
    if config.format not in FORMATS:
        raise DataError(f"--format: unknown format {config.format!r} (choose from {', '.join(FORMATS)})")
    if config.corpus == "python_stdlib":
        config.format = "text"
        config.tokenizer = config.tokenizer or "bytes"
        config.tgt_len = STDLIB_TGT_LEN if config.tgt_len is None else config.tgt_len
        if config.max_train_bytes < 0:
            config.max_train_bytes = STDLIB_MAX_TRAIN_BYTES
        if config.max_eval_bytes < 0:
            config.max_eval_bytes = STDLIB_MAX_EVAL_BYTES
    config.tokenizer = config.tokenizer or DEFAULT_TOKENIZER[config.format]
    config.tgt_len = 512 if config.tgt_len is None else config.tgt_len
    config.max_train_bytes = max(0, config.max_train_bytes)
    config.max_eval_bytes = max(0, config.max_eval_bytes)
    if config.tokenizer not in TOKENIZERS:
        raise DataError(f"--tokenizer: unknown tokenizer {config.tokenizer!r} "
                        f"(choose from {', '.join(TOKENIZERS)})")
    if config.errors not in ("strict", "replace"):
        raise DataError(f"--errors must be strict or replace, not {config.errors!r}")
    if config.documents == "auto":
        config.documents = "file" if config.format == "lm1b" else "none"
    if config.documents not in ("none", "file"):
        raise DataError(f"--documents must be auto, none or file, not {config.documents!r}")
    if config.tgt_len < 1:
        raise DataError(f"--tgt_len must be >= 1, got {config.tgt_len}")
    if config.num_streams < 1:
        raise DataError(f"--num_streams must be >= 1, got {config.num_streams}")
    return config


def prepare(config: PrepareConfig, log=print) -> dict:
    """Runs the whole preparation; returns the manifest.  Raises `DataError`."""
    config = _resolve(config)
    text = config.tokenizer != "bytes"
    # Check inputs (existence, readability, flags) before touching the output.
    pieces = _split_pieces(config, text)
    keep_documents = config.documents == "file"
    caps = {"train": config.max_train_bytes, "valid": config.max_eval_bytes,
            "test": config.max_eval_bytes}
    pieces = {name: _capped(p, caps[name]) for name, p in pieces.items()}
    if config.tokenizer == "sentencepiece" and not config.sentencepiece_model:
        raise DataError("--tokenizer=sentencepiece needs --sentencepiece_model=PATH")
    created, old_manifest = _prepare_output_dir(config.output_dir, config.overwrite)
    tmp_dir = os.path.join(config.output_dir, f"{TMP_PREFIX}{os.getpid()}")
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    try:
        os.makedirs(tmp_dir)
        manifest = _prepare_into(config, pieces, keep_documents, tmp_dir, old_manifest, log)
    except BaseException as err:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        if created and os.path.isdir(config.output_dir) and not os.listdir(config.output_dir):
            os.rmdir(config.output_dir)
        # Inputs were checked above: what fails here is writing (read-only, full disk, quota).
        if isinstance(err, OSError):
            raise DataError(f"cannot write into --output_dir {config.output_dir}: "
                            f"{err.strerror or err} ({err.filename or tmp_dir})") from None
        if isinstance(err, tf.errors.OpError):
            raise DataError(f"cannot write into --output_dir {config.output_dir}: "
                            f"{err.message}") from None
        raise
    shutil.rmtree(tmp_dir, ignore_errors=True)
    return manifest


def _prepare_into(config, pieces, keep_documents, tmp_dir, old_manifest, log) -> dict:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    text = config.tokenizer != "bytes"
    started = time.time()
    tokenizer = build_tokenizer(config, config.tokenizer,
                                _documents(pieces.get("train", []), keep_documents), log)
    encode = _encoder(tokenizer)
    dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.int32
    T, S = config.tgt_len, config.num_streams
    files, splits, input_bytes_total = [], {}, 0
    train_counts = np.zeros(tokenizer.vocab_size, np.int64)
    for split, split_pieces in pieces.items():
        # --- tokenise into a flat temporary token file -----------------------
        token_path = os.path.join(tmp_dir, f"{split}.tokens.bin")
        doc_starts, total, input_bytes = [], 0, 0
        documents = _documents(split_pieces, keep_documents)
        with open(token_path, "wb") as out:
            for document in documents:
                doc_starts.append(total)
                out.write(np.array([tokenizer.eod_id], dtype).tobytes())
                total += 1
                for chunk in iter_document_chunks(document, text, config.errors):
                    input_bytes += len(chunk) if not text else len(chunk.encode("utf-8"))
                    ids = encode(chunk)
                    # (file.write, not ndarray.tofile: a full disk is ENOSPC, not a count)
                    out.write(ids.astype(dtype, copy=False).tobytes())
                    total += ids.size
                    if split == "train":
                        train_counts += np.bincount(ids, minlength=tokenizer.vocab_size)[
                            :tokenizer.vocab_size]
        input_bytes_total += input_bytes
        num_targets = total - len(doc_starts)
        where = ", ".join(p.label for p in split_pieces[:3]) + (" ..." if len(split_pieces) > 3 else "")
        if num_targets == 0:
            raise DataError(f"split {split!r} is empty (no tokens in {where or 'no files'})")
        if num_targets < S * T:
            raise DataError(f"split {split!r} has {num_targets} tokens, fewer than one segment "
                            f"per stream (--num_streams={S} x --tgt_len={T} = {S * T}); "
                            "lower --num_streams or --tgt_len, or give more data")
        # --- cut into streams and segments, one TFRecord file per stream -----
        reader = _TokenReader(token_path, dtype)
        starts = np.asarray(doc_starts, np.int64)
        bounds = stream_bounds(total, S)
        streams = []
        for s in range(S):
            name = shard_name(split, s, S)
            path = os.path.join(tmp_dir, name)
            segments = targets = 0
            with tf.io.TFRecordWriter(path) as writer:
                for tokens, reset in iter_segments(reader, bounds[s], bounds[s + 1], starts, T):
                    writer.write(_example(tokens, T, tokenizer.pad_id, reset, s, segments))
                    segments += 1
                    targets += tokens.size - 1
            if segments == 0:
                raise DataError(f"split {split!r}: stream {s} has no tokens (too many empty "
                                "documents for --num_streams); lower --num_streams")
            with open(path, "rb") as f:
                os.fsync(f.fileno())
            streams.append({"file": name, "bytes": os.path.getsize(path),
                            "segments": segments, "tokens": targets})
            files.append(name)
        os.remove(token_path)
        assert sum(s["tokens"] for s in streams) == num_targets
        splits[split] = {
            "tokens": num_targets, "segments": sum(s["segments"] for s in streams),
            "documents": len(doc_starts), "input_bytes": input_bytes,
            "resets_inside": bool(keep_documents and len(doc_starts) > 1),
            "input_files": [p.label for p in split_pieces][:1000],
            "streams": streams,
        }
        log(f"{split}: {num_targets} tokens, {splits[split]['segments']} segments in {S} streams")

    spec = tokenizer.save(tmp_dir)
    files += [spec[k] for k in ("vocab_file", "model_file") if spec.get(k)]
    manifest = {
        "format_version": manifest_lib.FORMAT_VERSION,
        "created_by": "tfxl-prepare",
        "tokenizer": spec,
        "vocab_size": tokenizer.vocab_size,
        "vocab_sha256": spec["vocab_sha256"],
        "pad_id": tokenizer.pad_id,
        "eod_id": tokenizer.eod_id,
        "is_character_level": tokenizer.is_character_level,
        "cutoffs": suggest_cutoffs(train_counts, tokenizer.kind == "words"),
        "tgt_len": T,
        "num_streams": S,
        "record": {
            "type": "tf.train.Example", "compression": None,
            "features": {"tokens": ["int64", [T + 1]], "length": ["int64", []],
                         "reset": ["int64", []], "stream": ["int64", []],
                         "position": ["int64", []]},
        },
        "source": {"corpus": config.corpus, "format": config.format,
                   "documents": config.documents, "errors": config.errors,
                   "seed": config.seed, "max_train_bytes": config.max_train_bytes,
                   "max_eval_bytes": config.max_eval_bytes},
        "splits": splits,
    }
    _finalize(tmp_dir, config.output_dir, files, manifest, old_manifest)
    seconds = time.time() - started
    log(f"wrote {config.output_dir}: {input_bytes_total / 1e6:.1f} MB in {seconds:.1f} s "
        f"({input_bytes_total / 1e6 / max(seconds, 1e-9):.2f} MB/s)")
    return manifest


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------
def define_flags(flag_values=None) -> None:
    """Registers the tfxl-prepare flags (only when the CLI runs, never on import)."""
    from absl import flags  # pylint: disable=import-outside-toplevel

    fv = flag_values if flag_values is not None else flags.FLAGS
    flags.DEFINE_enum("corpus", None, list(CORPORA),
                      "Embedded corpus instead of --train/--valid/--test.", flag_values=fv)
    flags.DEFINE_list("train", [], "Training files or globs (comma-separated).", flag_values=fv)
    flags.DEFINE_list("valid", [], "Validation files or globs.", flag_values=fv)
    flags.DEFINE_list("test", [], "Test files or globs.", flag_values=fv)
    flags.DEFINE_enum("format", "text", list(FORMATS), "Input format.", flag_values=fv)
    flags.DEFINE_enum("tokenizer", None, list(TOKENIZERS),
                      "Tokenizer (default: bytes for text/enwik8, chars for text8, words for "
                      "wikitext/lm1b).", flag_values=fv)
    flags.DEFINE_string("sentencepiece_model", None, "A SentencePiece .model file.",
                        flag_values=fv)
    flags.DEFINE_integer("min_freq", 1, "words/chars: minimum training count.", flag_values=fv)
    flags.DEFINE_integer("max_size", 0, "words/chars: maximum vocabulary size including "
                         "specials (0 = unlimited).", flag_values=fv)
    flags.DEFINE_integer("wordpiece_vocab_size", 8000, "wordpiece: target vocabulary size.",
                         flag_values=fv)
    flags.DEFINE_integer("wordpiece_sample_bytes", 32 << 20,
                         "wordpiece: learn the vocabulary from this many training bytes.",
                         flag_values=fv)
    flags.DEFINE_integer("tgt_len", None, "Tokens per segment T (default 64 for "
                         "python_stdlib, else 512).", flag_values=fv)
    flags.DEFINE_integer("num_streams", 16, "Streams per split S.", flag_values=fv)
    flags.DEFINE_enum("documents", "auto", ["auto", "none", "file"],
                      "Document boundaries: file = each input file is a document (memory "
                      "reset); none = one long document; auto = file for lm1b.", flag_values=fv)
    flags.DEFINE_integer("max_train_bytes", -1, "Cap on training input bytes (-1: 4 MiB for "
                         "python_stdlib, else none; 0: none).", flag_values=fv)
    flags.DEFINE_integer("max_eval_bytes", -1, "Cap on valid/test input bytes each (-1: "
                         "256 KiB for python_stdlib, else none; 0: none).", flag_values=fv)
    flags.DEFINE_string("output_dir", None, "Output directory.", flag_values=fv)
    flags.DEFINE_bool("overwrite", False, "Replace prepared data in a non-empty --output_dir.",
                      flag_values=fv)
    flags.DEFINE_enum("errors", "strict", ["strict", "replace"],
                      "Invalid UTF-8 for text tokenizers: strict = fail naming file and "
                      "offset; replace = substitute U+FFFD.", flag_values=fv)
    flags.DEFINE_integer("seed", 0, "Seed for lm1b sentence shuffling.", flag_values=fv)


def config_from_flags(fv) -> PrepareConfig:
    return PrepareConfig(
        output_dir=fv.output_dir, train=fv.train, valid=fv.valid, test=fv.test,
        corpus=fv.corpus, format=fv.format, tokenizer=fv.tokenizer,
        sentencepiece_model=fv.sentencepiece_model, min_freq=fv.min_freq,
        max_size=fv.max_size, wordpiece_vocab_size=fv.wordpiece_vocab_size,
        wordpiece_sample_bytes=fv.wordpiece_sample_bytes, tgt_len=fv.tgt_len,
        num_streams=fv.num_streams, documents=fv.documents,
        max_train_bytes=fv.max_train_bytes, max_eval_bytes=fv.max_eval_bytes,
        overwrite=fv.overwrite, errors=fv.errors, seed=fv.seed)


def main_with_flags(fv, argv=()) -> int:
    """Runs prepare from parsed flags; returns the exit code (2 on bad input)."""
    if len(argv) > 1:
        print(f"error: unexpected arguments: {' '.join(argv[1:])}", file=sys.stderr)
        return 2
    try:
        prepare(config_from_flags(fv), log=lambda msg: print(msg, file=sys.stderr))
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def main(argv):
    from absl import flags  # pylint: disable=import-outside-toplevel
    return main_with_flags(flags.FLAGS, argv)


def run():
    """Console-script entry point (`tfxl-prepare`)."""
    from tfxl import cli  # pylint: disable=import-outside-toplevel
    cli.run(main, define_flags)


if __name__ == "__main__":
    run()
