"""Where a split's text comes from: input files (checked up front), the embedded corpus, the
train/valid/test split, byte caps, and reading a byte range of a file in validated chunks.

Input files, globs and zip archives are read through `tf.io.gfile` (`tfxl.files`), so
``--train=gs://bucket/enwik8.zip`` works like a local path.

A split is a list of `FilePiece`s (byte ranges of files or zip members) in corpus order; how the
pieces turn into documents is the corpus format's business (`tfxl.data.formats`).
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import itertools
import os
import sysconfig
import zipfile
from typing import Iterator, List, Optional, Sequence

from tfxl.data.errors import DataError
from tfxl.deferred import deferred_import
from tfxl.files import open_read, reason

tf = deferred_import("tensorflow")  # imported on first use: not by the tools' --help

SPLITS = ("train", "valid", "test")
CORPORA = ("python_stdlib",)
# The paper's enwik8/text8 split: the last 5M bytes are test, the 5M before valid.
PAPER_EVAL_BYTES = 5_000_000
CHUNK_BYTES = 1 << 20


@dataclasses.dataclass
class FilePiece:
    """Bytes [start, end) of a file (or of a zip member)."""

    path: str
    start: int = 0
    end: Optional[int] = None
    member: Optional[str] = None
    shuffle_seed: int = 0         # lm1b: the order of this file's sentences

    @property
    def label(self) -> str:
        return f"{self.path}:{self.member}" if self.member else self.path

    def open(self):
        if self.member:
            handle = _ZipMember(self.path, self.member)
            _skip(handle, self.start)
            return handle
        handle = open_read(self.path)
        handle.seek(self.start)
        return handle


class _ZipMember:
    """A member of a zip archive on any file system, read through the archive's open file (which
    `zipfile` seeks in); closing it closes the archive and the file."""

    def __init__(self, path: str, member: str):
        self._file = open_read(path)
        try:
            self._archive = zipfile.ZipFile(self._file)
            self._member = self._archive.open(member)
        except BaseException:
            self._file.close()
            raise

    def read(self, size: int = -1) -> bytes:
        return self._member.read(size)

    def readline(self) -> bytes:
        return self._member.readline()

    def close(self) -> None:
        self._member.close()
        self._archive.close()
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def zip_members(path: str) -> Optional[List[str]]:
    """The file members of a zip archive, or None when `path` is not one."""
    with open_read(path) as f:
        if not zipfile.is_zipfile(f):
            return None
        with zipfile.ZipFile(f) as archive:
            return [i.filename for i in archive.infolist() if not i.is_dir()]


def _skip(handle, count: int) -> None:
    while count > 0:
        block = handle.read(min(count, CHUNK_BYTES))
        if not block:
            break
        count -= len(block)


def expand_paths(flag: str, patterns: Sequence[str]) -> List[str]:
    """Files named by a flag's comma-separated paths/globs, checked readable."""
    paths = []
    for pattern in patterns:
        if any(ch in pattern for ch in "*?["):
            try:
                matches = sorted(tf.io.gfile.glob(pattern))
            except tf.errors.OpError as e:
                raise DataError(f"--{flag}: cannot list {pattern!r}: {reason(e)}"
                                ) from None
            if not matches:
                raise DataError(f"--{flag}: no files match {pattern!r}")
            paths.extend(matches)
        else:
            paths.append(pattern)
    for path in paths:
        try:
            if not tf.io.gfile.exists(path):
                raise DataError(f"--{flag}: file not found: {path}")
            if tf.io.gfile.isdir(path):
                raise DataError(f"--{flag}: {path} is a directory, expected a file or glob")
            with open_read(path) as f:
                f.read(1)
        except (OSError, tf.errors.OpError) as e:
            raise DataError(f"--{flag}: cannot read {path}: {reason(e, path)}") from None
    return paths


def piece_size(piece: FilePiece) -> int:
    if piece.member:
        with open_read(piece.path) as f, zipfile.ZipFile(f) as archive:
            return archive.getinfo(piece.member).file_size
    return tf.io.gfile.stat(piece.path).length


def piece_bytes(piece: FilePiece) -> int:
    """The number of bytes in `piece`."""
    return (piece.end if piece.end is not None else piece_size(piece)) - piece.start


def open_piece(piece: FilePiece):
    """`piece.open()`, a DataError naming the file when it cannot be opened."""
    try:
        return piece.open()
    except (OSError, tf.errors.OpError, zipfile.BadZipFile, KeyError) as e:
        raise DataError(f"cannot read {piece.label}: {reason(e, piece.path)}") from None


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


def stdlib_files(root: Optional[str] = None) -> List[str]:
    """Sorted *.py files of the running Python's standard library (no site-packages), or of the
    tree at `root`."""
    root = root or sysconfig.get_paths()["stdlib"]
    found = []
    for directory, subdirs, files in tf.io.gfile.walk(root):
        subdirs[:] = sorted(d for d in subdirs
                            if d not in ("site-packages", "dist-packages", "__pycache__"))
        found.extend(os.path.join(directory, f) for f in sorted(files) if f.endswith(".py"))
    return sorted(found, key=lambda p: os.path.relpath(p, root))


def stdlib_split_of(relative_path: str) -> str:
    """Deterministic ~90/5/5 split by a hash of the path relative to the stdlib root."""
    bucket = int(hashlib.sha256(relative_path.encode("utf-8")).hexdigest(), 16) % 100
    return "train" if bucket < 90 else ("valid" if bucket < 95 else "test")


def capped(pieces: List[FilePiece], cap: int) -> List[FilePiece]:
    """Leading pieces up to `cap` bytes in total (the last one truncated)."""
    if cap <= 0:
        return pieces
    out, total = [], 0
    for piece in pieces:
        size = piece_bytes(piece)
        if total + size >= cap:
            out.append(dataclasses.replace(piece, end=piece.start + (cap - total)))
            break
        out.append(piece)
        total += size
    return out


def split_pieces(train: Sequence[str], valid: Sequence[str], test: Sequence[str], corpus_format,
                 text: bool, seed: int, corpus: Optional[str] = None) -> dict:
    """split name -> list of FilePiece, in corpus order.

    `train`/`valid`/`test` are the flags' paths or globs; `corpus` an embedded corpus instead.
    `text`: the tokenizer reads text, so a single-file split cuts at a line start (a line-record
    format always does).
    """
    if corpus == "python_stdlib":
        root = sysconfig.get_paths()["stdlib"]
        splits = {s: [] for s in SPLITS}
        for path in stdlib_files():
            splits[stdlib_split_of(os.path.relpath(path, root))].append(FilePiece(path))
        return splits

    train = expand_paths("train", train)
    valid = expand_paths("valid", valid)
    test = expand_paths("test", test)
    if not train:
        raise DataError("--train is required (or --corpus=python_stdlib)")
    if not valid and not test and corpus_format.splits_single_file:
        return _cut_into_splits([corpus_format.file_piece(p) for p in train],
                                text or corpus_format.line_records)
    out = {}
    for name, paths in (("train", train), ("valid", valid), ("test", test)):
        if paths:
            out[name] = [corpus_format.file_piece(p) for p in paths]
    return {name: corpus_format.split_pieces(split_index, pieces, seed)
            for split_index, (name, pieces) in enumerate(out.items())}


def _cut_into_splits(pieces, at_lines):
    """The --train files alone, read as one corpus in order: the paper's split (its last 5M bytes
    test, the 5M before valid); a smaller corpus keeps the same 90/5/5 proportions. A cut falls
    at a line start where `at_lines` (else at a character boundary), inside whichever file it
    reaches."""
    sizes = [piece_size(p) for p in pieces]
    total = sum(sizes)
    eval_bytes = min(PAPER_EVAL_BYTES, total // 20)
    starts = list(itertools.accumulate([0, *sizes]))  # each file's first byte in the corpus
    cuts = []  # each cut as (file index, offset in it)
    for cut in (total - 2 * eval_bytes, total - eval_bytes):
        index = min(bisect.bisect_right(starts, cut) - 1, len(sizes) - 1)
        offset = cut - starts[index]
        if at_lines:
            offset = _next_line_start(pieces[index], offset, sizes[index])
        cuts.append(max([(index, offset), *cuts]))
    splits = {name: [] for name in ("train", "valid", "test")}
    bounds = [(0, 0), *cuts, (len(pieces) - 1, sizes[-1])]
    for name, (first, last) in zip(splits, zip(bounds, bounds[1:])):
        for i in range(first[0], last[0] + 1):
            begin = first[1] if i == first[0] else 0
            end = last[1] if i == last[0] else sizes[i]
            if end > begin or first[0] == last[0]:
                splits[name].append(dataclasses.replace(pieces[i], start=begin, end=end))
    return splits


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


def raw_chunks(piece: FilePiece, whole_lines: bool) -> Iterator[tuple]:
    """Yields (bytes, byte offset in the file) of about CHUNK_BYTES each."""
    with open_piece(piece) as handle:
        remaining = None if piece.end is None else piece.end - piece.start
        offset, carry = piece.start, b""
        while True:
            want = CHUNK_BYTES if remaining is None else min(CHUNK_BYTES, remaining)
            try:
                block = handle.read(want) if want > 0 else b""
            except (OSError, tf.errors.OpError) as e:
                raise DataError(f"cannot read {piece.label}: {reason(e, piece.path)}"
                                ) from None
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


def decode(data: bytes, label: str, offset: int, errors: str) -> str:
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as e:
        raise DataError(f"{label}: invalid UTF-8 at byte offset {offset + e.start} "
                        "(pass --errors=replace to substitute U+FFFD, or use --tokenizer=bytes)"
                        ) from None
