"""The files the tools read and write (configs, metrics, fingerprints, logs, exported trees,
corpora, prepared data, presets), on any file system.

One place for the rules every tool follows: every path a user gives goes through
`tf.io.gfile`, so a local path, ``gs://`` and any other TensorFlow file system work alike; a
file that cannot be read or parsed is one ValueError naming it; a result is published whole
(`write_text_atomically`, `StagedDirectory`). Only local scratch (prepare's flat token files, a
tree written by code that knows only os and open()) uses plain Python file calls. TensorFlow is
imported on first use, not by `import tfxl`.

What "published whole" means depends on the file system (`is_local`):
  * local (no scheme, or file://): files are built under a temporary name and renamed into
    place, rename(2) being atomic on POSIX;
  * an object store (any other scheme: gs://, s3://, ...): there is no atomic rename (a
    "rename" is a copy of every object, then a delete), so the finished files are uploaded
    object by object with the names a reader trusts (an export's saved_model.pb, a preset's
    config.json, prepared data's manifest.json) written last; until that last object exists
    readers treat the result as absent. An object becomes visible only once its upload
    completes, so a single file is written in one go.
"""

import io
import json
import math
import os
import re
import secrets
import shutil
import tempfile

from tfxl.deferred import deferred_import

tf = deferred_import("tensorflow")

READ_BUFFER = 1 << 20

# TensorFlow's own URI rule (tsl::io::ParseURI): a scheme is a letter, then letters, digits and
# dots, followed by "://".
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9.]*)://")


def is_local(path):
    """Whether `path` lies on the local file system: no scheme, or file://. Any other scheme is
    an object store to tfxl (no atomic directory rename)."""
    match = _SCHEME.match(os.fspath(path))
    return match is None or match.group(1).lower() == "file"


def read_json(path, what, fields=None):
    """A JSON file's object; ValueError naming the file when it cannot be read or parsed, or
    holds something other than an object, or (`fields`: see `check_fields`) a field of
    another kind."""
    try:
        with tf.io.gfile.GFile(path) as f:
            data = json.load(f)
    except (OSError, tf.errors.OpError) as err:
        raise ValueError(f"{what} {path}: cannot read ({err})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{what} {path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what} {path}: expected a JSON object")
    return data if fields is None else check_fields(data, path, what, fields)


# What a field of a record may hold (`check_fields`): a test and the words that name it. A record
# is a JSON file tfxl wrote itself (run.json, lease.json, data.json, metrics.json, a train log
# line); a damaged one is refused where it is read, naming the file and the field, never left to
# fail later as a TypeError far from its cause.
def _is_integer(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


# Unix seconds up to the year 5138: time.localtime and strftime overflow far beyond it.
_LATEST_TIME = 1e11

FIELD_KINDS = {
    "integer": (_is_integer, "an integer"),
    "count": (lambda v: _is_integer(v) and v >= 1, "an integer >= 1"),
    "number": (_is_number, "a finite number"),
    # NaN and infinities too (a diverged step's loss is logged as it was)
    "real": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    "positive": (lambda v: _is_number(v) and v > 0, "a finite number > 0"),
    "time": (lambda v: _is_number(v) and 0 <= v <= _LATEST_TIME, "a time in Unix seconds"),
    "text": (lambda v: isinstance(v, str), "a string"),
    "object": (lambda v: isinstance(v, dict), "a JSON object"),
    "list": (lambda v: isinstance(v, list), "a JSON list"),
}


def field_error(record, fields):
    """Why `record` (a dict) does not hold `fields`, or None: {name: kind}, kind a FIELD_KINDS
    name; "kind?" may also be null or absent. The first wrong field is named."""
    for name, kind in fields.items():
        optional = kind.endswith("?")
        test, words = FIELD_KINDS[kind.rstrip("?")]
        value = record.get(name)
        if value is None and optional:
            continue
        if name not in record:
            return f"its field {name!r} is missing (it must be {words})"
        if not test(value):
            shown = json.dumps(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            return (f"its field {name!r} must be {words}"
                    + (" or null" if optional else "") + f", not {shown}")
    return None


def check_fields(record, path, what, fields):
    """Refuses (ValueError naming `what`, `path` and the field) a record that does not hold
    `fields` (see `field_error`); returns the record."""
    why = field_error(record, fields)
    if why:
        raise ValueError(f"{what} {path} is damaged: {why}")
    return record


def write_text_atomically(path, text):
    """Writes `text` (str, or bytes) to `path` whole or not at all: to a temporary file renamed
    over `path`, or, on an object store, as one object write (atomic when the upload completes
    at close)."""
    mode = "wb" if isinstance(text, bytes) else "w"
    if not is_local(path):
        with tf.io.gfile.GFile(path, mode) as f:
            f.write(text)
        return
    # Unique per writer, not per process: two writers in one process (threads) must not share it.
    tmp = f"{path}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    with tf.io.gfile.GFile(tmp, mode) as f:
        f.write(text)
    tf.io.gfile.rename(tmp, path, overwrite=True)


def write_json_atomically(path, payload):
    """Writes `payload` as indented JSON, atomically (write_text_atomically)."""
    write_text_atomically(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")


def check_writable(path, what):
    """Fails now, with one ValueError naming `path`, when `write_text_atomically(path, ...)`
    would fail later (a tool that computes for minutes before it writes checks first): a local
    parent directory must exist; anywhere, a probe file beside `path` must be writable (it is
    removed at once)."""
    path = os.fspath(path)
    if tf.io.gfile.isdir(path):
        raise ValueError(f"{what}={path} is a directory")
    if is_local(path):
        parent = os.path.dirname(path if "://" in path else os.path.abspath(path))
        if not tf.io.gfile.isdir(parent):
            raise ValueError(f"{what}={path}: directory {parent} does not exist")
    probe = f"{path}.tmp-check-{os.getpid()}"
    try:
        with tf.io.gfile.GFile(probe, "w") as f:
            f.write("")
        tf.io.gfile.remove(probe)
    except (OSError, tf.errors.OpError) as err:
        raise ValueError(f"{what}={path}: cannot write there ({' '.join(str(err).split())})") \
            from None


def local_path(path):
    """A local path (``file://`` removed) for the os-level calls `tf.io.gfile` has no
    equivalent of (fsync)."""
    return path[len("file://"):] if path.startswith("file://") else path


def reason(err, path=None):
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


def listdir(path):
    """The names in a directory (object stores list sub-directories with a trailing '/')."""
    return [name.rstrip("/") for name in tf.io.gfile.listdir(path)]


def fsync_local(path):
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


def open_read(path):
    """A binary file of any TensorFlow file system, seekable, with Python's own buffering and
    `readline`: GFile's readline drops every ``\\r``, which would change the bytes (and the byte
    offsets errors name) of a file with CRLF line ends. `zipfile` reads an archive through it.
    Errors (a missing file, too) are raised by the first read, as `tf.errors.OpError`."""
    return io.BufferedReader(_GFileRaw(tf.io.gfile.GFile(path, "rb")), READ_BUFFER)


def read_bytes(path):
    with tf.io.gfile.GFile(path, "rb") as f:
        return f.read()


def write_bytes(path, data):
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(data)


def list_files(root):
    """The relative paths of every file below the directory `root` (tf.io.gfile), sorted."""
    root = os.fspath(root).rstrip("/")
    found = []
    for directory, _, names in tf.io.gfile.walk(root):
        relative = directory[len(root):].strip("/")
        found += [f"{relative}/{name}" if relative else name for name in names]
    return sorted(found)


def copy_tree(source, target, last=(), overwrite=False, names=None):
    """Copies every file below `source` to the same relative path below `target` (tf.io.gfile),
    the relative paths in `last` after all the others, in that order; returns the relative paths
    in the order copied. `overwrite=False` refuses (tf.errors.AlreadyExistsError) to replace a
    file; `names`: only those relative paths (default: every file). On an object store each
    object appears whole once copied, so a reader that waits for the `last` names never sees the
    others missing."""
    source, target = os.fspath(source), os.fspath(target)
    files = list_files(source) if names is None else sorted(set(names))
    order = [f for f in files if f not in last] + [f for f in last if f in files]
    made = set()
    for relative in order:
        directory = os.path.dirname(os.path.join(target, relative))
        if directory not in made:
            tf.io.gfile.makedirs(directory)
            made.add(directory)
        tf.io.gfile.copy(os.path.join(source, relative), os.path.join(target, relative),
                         overwrite=overwrite)
    return order


def remove_quietly(path):
    """Deletes the file or tree `path` if it exists; errors are swallowed: this only cleans up
    (a leftover temporary name is ignored by every reader and can be deleted by hand)."""
    try:
        if tf.io.gfile.isdir(path):
            tf.io.gfile.rmtree(path)
        elif tf.io.gfile.exists(path):
            tf.io.gfile.remove(path)
    except (OSError, tf.errors.OpError):
        pass


def _holds_something(path):
    """Whether `path` exists as a file or as a directory that is not empty."""
    if not tf.io.gfile.exists(path):
        return False
    return not tf.io.gfile.isdir(path) or bool(tf.io.gfile.listdir(path))


class StagedDirectory:
    """Files built aside, at `path`, and published at `final` (see the module docstring): the
    one way tfxl publishes a result of several files, or one file written by code that cannot
    write it atomically itself.

        with StagedDirectory(final, "export") as staged:
            write_everything(staged.path)
            staged.publish(last=("saved_model.pb",))

    Where `path` lies:
      * given (`path=`): a name the caller's readers already ignore, on `final`'s file system
        (prepare's ``.tmp-prepare-<pid>`` inside its output directory), created by the caller;
      * `scratch=` a prefix: a fresh local temporary directory (it exists), for a tree written
        with os and open() (a keras-hub preset, a .keras file), published by an upload or by
        `publish_file` (a rename from it may cross disks);
      * otherwise ".tmp-<kind>-<name>-<random>", a name readers ignore: beside `final` on a
        local disk, in a local temporary directory for an object store (gfile lists a local tree
        reliably, and a killed run leaves nothing in the bucket).
    `local` says whether `final` is on a local disk (default: `is_local(final)`), for a caller
    that has decided already.

    Three ways to publish: `publish()` makes the staged tree `final` (never over anything);
    `publish(replace=True)` moves the staged files into `final` over their namesakes;
    `publish_file(name)` makes one staged file the file `final`. Whatever happens, nothing of
    the temporary name is left when the block ends (or at `discard`). The object store gives no
    exclusivity: two writers publishing the same `final` at once are not kept apart there
    (locally the second rename of a whole tree fails).
    """

    def __init__(self, final, kind, *, path=None, scratch=None, local=None):
        self.final = os.fspath(final).rstrip("/")
        self.local = is_local(self.final) if local is None else local
        parent, name = os.path.split(self.final)
        tag = f".tmp-{kind}-{name}-{secrets.token_hex(4)}"
        self._local_root = None
        if path is not None:
            self.path = os.fspath(path)
        elif scratch is not None:
            self._local_root = self.path = tempfile.mkdtemp(prefix=scratch)
        elif self.local:
            self.path = os.path.join(parent, tag)
        else:
            self._local_root = tempfile.mkdtemp(prefix="tfxl-staging-")
            self.path = os.path.join(self._local_root, tag)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.discard()
        return False

    def discard(self):
        """Removes the staged files (errors swallowed: a leftover temporary name is not data)."""
        remove_quietly(self.path)
        if self._local_root is not None:
            shutil.rmtree(self._local_root, ignore_errors=True)

    def publish(self, last=(), names=None, replace=False):
        """Publishes the staged files, the relative paths in `last` after all the others.

        replace=False: the staged tree becomes `final`; FileExistsError (nothing changed) when
        `final` already holds something. Locally one rename; on an object store an upload that,
        failing midway, removes what it uploaded, so no partial `final` stays behind.

        replace=True: the staged files `names` (default: all, `last` included) go into the
        directory `final` (created if needed), each replacing the file of its name there; the
        `last` files `final` holds and the staged files replace are removed first, so no reader
        combines the old result with the new one. Locally a rename per file, on an object store
        an upload per file; a failure leaves `final` without those `last` files."""
        if replace:
            self._replace(last, names)
            return
        if _holds_something(self.final):
            raise FileExistsError(f"{self.final} already exists")
        if self.local:
            # rename(2) replaces an empty directory in the same step and fails on a non-empty
            # one, so a concurrent writer's result is never replaced.
            try:
                tf.io.gfile.rename(self.path, self.final,
                                   overwrite=tf.io.gfile.exists(self.final))
            except tf.errors.OpError:
                if _holds_something(self.final):
                    raise FileExistsError(f"{self.final} already exists") from None
                raise
            return
        existed = tf.io.gfile.exists(self.final)
        try:
            copy_tree(self.path, self.final, last)
        except BaseException:
            # Everything below `final` is this upload's (it held nothing before): remove it, so
            # no incomplete directory stays where a reader would look.
            remove_quietly(self.final)
            if existed:  # the empty directory that was there
                try:
                    tf.io.gfile.makedirs(self.final)
                except (OSError, tf.errors.OpError):
                    pass  # the upload's own error is the one to report
            raise

    def _replace(self, last, names):
        last = [name for name in last if tf.io.gfile.exists(os.path.join(self.path, name))]
        for name in last:
            if tf.io.gfile.exists(os.path.join(self.final, name)):
                tf.io.gfile.remove(os.path.join(self.final, name))
        names = list_files(self.path) if names is None else list(names) + last
        if not self.local:
            copy_tree(self.path, self.final, last=last, overwrite=True, names=names)
            return
        for name in [n for n in names if n not in last] + last:
            target = os.path.join(self.final, name)
            if "/" in name:
                tf.io.gfile.makedirs(os.path.dirname(target))
            tf.io.gfile.rename(os.path.join(self.path, name), target, overwrite=True)

    def publish_file(self, name):
        """The staged file `name` becomes the file `final` (over any file of that name), whole
        or not at all, streamed (a .keras file may be gigabytes): on an object store one
        object write (whole at close); locally a rename, from beside `final` (a copy there
        first when the staging lies on another disk)."""
        source = os.path.join(self.path, name)
        if not self.local:
            tf.io.gfile.copy(source, self.final, overwrite=True)
            return
        tmp = source
        if self._local_root is not None:  # a scratch directory: perhaps another file system
            tmp = f"{self.final}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            if tmp != source:
                tf.io.gfile.copy(source, tmp, overwrite=True)
            tf.io.gfile.rename(tmp, self.final, overwrite=True)
        finally:
            if tmp != source:
                remove_quietly(tmp)
