"""The file systems of the data package: every path a user gives (corpus files and globs, zip
archives, --output_dir, vocabularies, SentencePiece models, data directories) goes through
`tf.io.gfile`, so a local path, ``gs://`` and any other TensorFlow file system work alike.

Only prepare's own scratch (the flat token files) is read and written with plain Python file
calls: it is always on a local disk (`tempfile`, or the local staging directory), never on a
bucket.

`is_local` tells the two kinds of output directory apart: a local one is published by renaming
(atomic per file), an object store has no rename to rely on (`tfxl.data.staging`).
"""

from __future__ import annotations

import io
import os


from tfxl.files import is_local
from tfxl.deferred import deferred_import

tf = deferred_import("tensorflow")

READ_BUFFER = 1 << 20


def local_path(path: str) -> str:
    """A local path (``file://`` removed) for the os-level calls `tf.io.gfile` has no
    equivalent of (fsync)."""
    return path[len("file://"):] if path.startswith("file://") else path


def reason(err: BaseException, path: str | None = None) -> str:
    """Why an OSError or a TensorFlow OpError happened, as one short phrase: its strerror, or the
    OpError's first line without the ``"<file>; "`` TensorFlow's local file system puts first
    when that file is `path` or a directory on the way to it (the error message names `path`
    already)."""
    if isinstance(err, tf.errors.OpError):
        lines = (err.message or "").strip().splitlines()
        message = lines[0] if lines else type(err).__name__
        where, separator, why = message.partition("; ")
        if path is not None and separator and (
                where == path or path.startswith(where.rstrip("/") + "/")):
            return why
        return message
    return getattr(err, "strerror", None) or str(err)


def listdir(path: str) -> list:
    """The names in a directory (object stores list sub-directories with a trailing '/')."""
    return [name.rstrip("/") for name in tf.io.gfile.listdir(path)]


def fsync_local(path: str) -> None:
    """Flushes a written file to a local disk; a no-op for object stores, where an object is
    durable once its writer is closed (and there is no file descriptor to sync)."""
    if not is_local(path):
        return
    fd = os.open(local_path(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _GFileRaw(io.RawIOBase):
    """A `tf.io.gfile.GFile` as a raw Python stream, for `io.BufferedReader` to buffer."""

    def __init__(self, gfile):
        super().__init__()
        self._file = gfile

    def readable(self):
        return True

    def seekable(self):
        return True

    def readinto(self, buffer):
        data = self._file.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def seek(self, offset, whence=io.SEEK_SET):
        self._file.seek(offset, whence)
        return self._file.tell()

    def tell(self):
        return self._file.tell()

    def close(self):
        if not self.closed:
            self._file.close()
        super().close()


def open_read(path: str) -> io.BufferedReader:
    """A binary file of any TensorFlow file system, seekable, with Python's own buffering and
    `readline`: GFile's readline drops every ``\\r``, which would change the bytes (and the byte
    offsets errors name) of a file with CRLF line ends. `zipfile` reads an archive through it.
    Errors (a missing file, too) are raised by the first read, as `tf.errors.OpError`."""
    return io.BufferedReader(_GFileRaw(tf.io.gfile.GFile(path, "rb")), READ_BUFFER)


def read_bytes(path: str) -> bytes:
    with tf.io.gfile.GFile(path, "rb") as f:
        return f.read()


def write_bytes(path: str, data: bytes) -> None:
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(data)
