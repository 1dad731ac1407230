"""Corpus formats (``tfxl-prepare --format``): one registered class per format.

A format says which tokenizer it uses by default, whether a lone ``--train`` file is split like
the paper's enwik8, what a document is, and how a split's file pieces (`tfxl.data.sources`)
become documents, each an iterator of chunks: ``str`` for text tokenizers, ``bytes`` for the
``bytes`` tokenizer. A new format is one subclass of `CorpusFormat` added to `FORMATS`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from typing import Iterator, List

import numpy as np

from tfxl.data.errors import DataError
from tfxl.data.sources import (CHUNK_BYTES, FilePiece, decode, open_piece, raw_chunks,
                               zip_members)
from tfxl.deferred import deferred_import
from tfxl.files import reason

tf = deferred_import("tensorflow")  # imported on first use: not by the tools' --help

# What --documents=auto means: keep the format's documents (a reset between them) or not.
DOCUMENTS = ("auto", "none", "file")


class CorpusFormat:
    """A corpus of files read as text (or raw bytes) in order; one file is one document."""

    name = ""
    default_tokenizer = "bytes"
    keeps_documents = False      # --documents=auto keeps this format's documents
    splits_single_file = False   # a lone --train file is cut into train/valid/test
    line_records = False         # records are lines: split points always fall at line starts

    def file_piece(self, path: str) -> FilePiece:
        """The whole of an input file."""
        return FilePiece(path)

    def split_pieces(self, split_index: int, pieces: List[FilePiece], seed: int) -> list:
        """A split's pieces as this format reads them (`split_index`: train 0, valid 1, test 2
        among the splits given)."""
        return pieces

    def piece_chunks(self, piece: FilePiece, text: bool, errors: str) -> Iterator:
        """A piece's text as chunks of about 1 MiB cut at line/word/character boundaries."""
        for chunk, offset in raw_chunks(piece, whole_lines=text):
            yield decode(chunk, piece.label, offset, errors) if text else chunk

    def documents(self, pieces: List[FilePiece], keep_documents: bool, text: bool,
                  errors: str) -> Iterator[Iterator]:
        """The split's documents in order, each an iterator of chunks. Without
        `keep_documents` the whole split is one document."""
        if not keep_documents:
            yield (chunk for piece in pieces for chunk in self.piece_chunks(piece, text, errors))
            return
        for piece in pieces:
            yield self.piece_chunks(piece, text, errors)


class TextFormat(CorpusFormat):
    """UTF-8 text files (any files with the bytes tokenizer), concatenated in order."""

    name = "text"
    splits_single_file = True


class Enwik8Format(CorpusFormat):
    """Raw bytes, or the original enwik8.zip read through its member."""

    name = "enwik8"
    splits_single_file = True

    def file_piece(self, path):
        names = zip_members(path)
        if names is None:
            return FilePiece(path)
        if not names:
            raise DataError(f"{path}: zip archive is empty")
        return FilePiece(path, member=self.name if self.name in names else names[0])


class Text8Format(Enwik8Format):
    """The text8 file or text8.zip: one line of lowercase letters and spaces."""

    name = "text8"
    default_tokenizer = "chars"


class WikiTextFormat(CorpusFormat):
    """wiki.{train,valid,test}.tokens: words, <eos> per line."""

    name = "wikitext"
    default_tokenizer = "words"


def _hash_seed(*parts) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little")


class Lm1bFormat(CorpusFormat):
    """One Billion Word style: many files of one sentence per line. Each file is a document and
    its sentences are shuffled with --seed (one file is held in memory while shuffling)."""

    name = "lm1b"
    default_tokenizer = "words"
    keeps_documents = True

    def split_pieces(self, split_index, pieces, seed):
        return [dataclasses.replace(p, shuffle_seed=_hash_seed(seed, split_index, i))
                for i, p in enumerate(pieces)]

    def piece_chunks(self, piece, text, errors):
        data = b"".join(chunk for chunk, _ in raw_chunks(piece, whole_lines=False))
        if text:
            data = decode(data, piece.label, piece.start, errors).encode("utf-8")
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


class JsonLinesFormat(CorpusFormat):
    """JSON Lines: one JSON object per line, its ``"text"`` string is one document.

    Blank lines are skipped. A document's text is followed by a newline unless it ends with one,
    as a line of a text file, so that with --documents=none consecutive documents stay apart.
    A line that is not a JSON object with a string ``text`` is an error naming file and line.
    """

    name = "jsonl"
    keeps_documents = True
    splits_single_file = True
    line_records = True
    text_field = "text"

    def texts(self, piece: FilePiece, errors: str) -> Iterator[str]:
        """The documents' texts of a piece (a byte range of whole lines)."""
        with open_piece(piece) as handle:
            offset = piece.start
            # Line numbers count from the piece's start: its own (1-based) lines.
            for number in itertools.count(1):
                if piece.end is not None and offset >= piece.end:
                    return
                try:
                    raw = handle.readline()
                except (OSError, tf.errors.OpError) as e:
                    raise DataError(f"cannot read {piece.label}: {reason(e, piece.path)}"
                                    ) from None
                if not raw:
                    return
                line = decode(raw, piece.label, offset, errors)
                offset += len(raw)
                if not line.strip():
                    continue
                where = f"{piece.label}: line {number}" if piece.start == 0 else (
                    f"{piece.label}: the line at byte offset {offset - len(raw)}")
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{where} is not valid JSON ({e.msg})") from None
                text = record.get(self.text_field) if isinstance(record, dict) else None
                if not isinstance(text, str):
                    raise DataError(f'{where}: expected a JSON object with a string '
                                    f'"{self.text_field}" field')
                yield text if text.endswith("\n") else text + "\n"

    def _encoded(self, text: str, where: str, errors: str, as_text: bool):
        # JSON escapes can spell lone surrogates ("\ud800"), which are not UTF-8.
        try:
            data = text.encode("utf-8", errors="strict" if errors == "strict" else "replace")
        except UnicodeEncodeError:
            raise DataError(f"{where}: text holds a lone surrogate, not valid Unicode "
                            "(pass --errors=replace to substitute '?')") from None
        return data.decode("utf-8") if as_text else data

    def piece_chunks(self, piece, text, errors):
        for document in self.texts(piece, errors):
            yield self._encoded(document, piece.label, errors, text)

    def documents(self, pieces, keep_documents, text, errors):
        if not keep_documents:
            yield from super().documents(pieces, False, text, errors)
            return
        for piece in pieces:
            for document in self.texts(piece, errors):
                yield iter([self._encoded(document, piece.label, errors, text)])


# The one registry of corpus formats: --format name -> format.
FORMATS = {f.name: f for f in (TextFormat(), Enwik8Format(), Text8Format(), WikiTextFormat(),
                               Lm1bFormat(), JsonLinesFormat())}


def get_format(name: str) -> CorpusFormat:
    if name not in FORMATS:
        raise DataError(f"--format: unknown format {name!r} (choose from {', '.join(FORMATS)})")
    return FORMATS[name]
