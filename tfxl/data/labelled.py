"""Labelled documents for classification, read from one of three layouts:

* ``jsonl``: one JSON object per line, ``{"text": ..., "label": ...}`` (field names
  configurable; a label may be a string or an integer); blank lines are skipped.
* ``csv``: a header row naming the text and label columns, then one document per row (quoted
  fields may span lines; line numbers are the row's first line).
* ``folders``: a directory with one sub-directory per label, each file in it one document.

Every path goes through `tf.io.gfile` (`tfxl.files`): ``gs://`` works. A bad input is a
`DataError` (a ValueError) naming the file and, for jsonl and csv, the line: not JSON, no text,
no label, an unknown column, a file without documents.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
from typing import Iterator, List, Sequence, Union

from tfxl.data.errors import DataError
from tfxl.data.sources import decode, expand_paths
from tfxl.deferred import deferred_import
from tfxl.files import listdir, open_read, read_bytes

tf = deferred_import("tensorflow")  # imported on first use: not by the tools' --help

LABELLED_FORMATS = ("jsonl", "csv", "folders")

# Python's csv module refuses fields over 128 KiB by default; a document may be far longer.
csv.field_size_limit(2**31 - 1)


@dataclasses.dataclass(frozen=True)
class LabelledDocument:
    """One document: its text (bytes for a tokenizer that reads raw bytes), its label's name, and
    where it was read ("file: line 3", or the file), for messages."""

    text: Union[str, bytes]
    label: str
    where: str


def read_labelled(layout: str, paths: Sequence[str], what: str, text_field: str = "text",
                  label_field: str = "label", as_text: bool = True,
                  errors: str = "strict") -> Iterator[LabelledDocument]:
    """The documents of `paths` (files or globs; for ``folders``, directories) in order.

    what: the option that named the paths, for messages ("train"). Each file must hold at least
    one document.
    """
    if layout not in LABELLED_FORMATS:
        raise DataError(f"unknown labelled format {layout!r} (choose from "
                        f"{', '.join(LABELLED_FORMATS)})")
    if layout == "folders":
        for root in paths:
            yield from _folder_documents(root, what, as_text, errors)
        return
    read = _jsonl_documents if layout == "jsonl" else _csv_documents
    for path in expand_paths(what, paths):
        count = 0
        for document in read(path, text_field, label_field, errors):
            count += 1
            yield document
        if count == 0:
            raise DataError(f"{path}: no documents (an empty {layout} file)")


def _label_name(value, where: str, label_field: str) -> str:
    # bool is an int to Python, not a label
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise DataError(f"{where}: no label (expected a string or an integer "
                        f"{label_field!r}, got {value!r})")
    return str(value)


def _jsonl_documents(path: str, text_field: str, label_field: str,
                     errors: str) -> Iterator[LabelledDocument]:
    with open_read(path) as handle:
        offset = 0
        for number, raw in enumerate(handle, start=1):
            line = decode(raw, path, offset, errors)
            offset += len(raw)
            if not line.strip():
                continue
            where = f"{path}: line {number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where} is not valid JSON ({e.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
                raise DataError(f"{where}: expected a JSON object with a string "
                                f"{text_field!r} field")
            if label_field not in record:
                raise DataError(f"{where}: no label (no {label_field!r} field)")
            yield LabelledDocument(record[text_field],
                                   _label_name(record[label_field], where, label_field), where)


def _csv_documents(path: str, text_field: str, label_field: str,
                   errors: str) -> Iterator[LabelledDocument]:
    try:
        with io.TextIOWrapper(open_read(path), encoding="utf-8", errors=errors,
                              newline="") as handle:
            rows = csv.reader(handle)
            header = next(rows, None)
            if header is None:
                return
            for name in (text_field, label_field):
                if name not in header:
                    raise DataError(f"{path}: line 1: no column {name!r} in the header "
                                    f"({', '.join(map(repr, header))})")
            text_at, label_at = header.index(text_field), header.index(label_field)
            line = rows.line_num + 1
            for row in rows:
                where = f"{path}: line {line}"
                line = rows.line_num + 1
                if not row:
                    continue
                if len(row) != len(header):
                    raise DataError(f"{where}: {len(row)} fields, the header has {len(header)}")
                yield LabelledDocument(row[text_at],
                                       _label_name(row[label_at], where, label_field), where)
    except csv.Error as e:
        raise DataError(f"{path}: not valid CSV ({e})") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: invalid UTF-8 ({e.reason}; pass errors='replace')") from None


def _folder_documents(root: str, what: str, as_text: bool,
                      errors: str) -> Iterator[LabelledDocument]:
    if not tf.io.gfile.isdir(root):
        raise DataError(f"{what}: {root} is not a directory (the folders format takes a "
                        "directory with one sub-directory per label)")
    labels = sorted(name for name in listdir(root)
                    if tf.io.gfile.isdir(os.path.join(root, name)))
    if not labels:
        raise DataError(f"{what}: {root} has no label sub-directories")
    for label in labels:
        folder = os.path.join(root, label)
        for name in _files(folder):
            path = os.path.join(folder, name)
            data = read_bytes(path)
            yield LabelledDocument(decode(data, path, 0, errors) if as_text else data, label,
                                   path)


def _files(folder: str) -> List[str]:
    return sorted(name for name in listdir(folder)
                  if not tf.io.gfile.isdir(os.path.join(folder, name)))
