"""The files the tools read and write (configs, metrics, fingerprints, logs, exported trees).

One place for the rules every tool follows: a file that cannot be read or parsed is one
ValueError naming it; a file is written to a temporary name and renamed over the old one, so a
killed run never leaves half a file; a directory of several files is built under a temporary
name and published whole (`StagedDirectory`). Everything goes through tf.io.gfile, so every
path may be local or a bucket (gs://...).

What "published whole" means depends on the file system (`is_local`):
  * local (no scheme, or file://): one rename(2) of the finished directory, atomic on POSIX;
  * an object store (any other scheme: gs://, s3://, ...): there is no atomic rename of a
    directory (a "rename" is a copy of every object, then a delete), so the finished tree is
    copied object by object with the names a reader waits for (an export's saved_model.pb)
    copied last; until that last object exists the directory is incomplete, and readers treat
    it as absent.

A single file is written whole or not at all: on a file system to a temporary name renamed
over the old one; on an object store, which makes an object visible only once its upload
completes, in one go.
"""

import json
import math
import os
import secrets
import shutil
import tempfile


from tfxl.paths import is_local  # also tfxl.files.is_local, for the tools
from tfxl.deferred import deferred_import

tf = deferred_import("tensorflow")


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
    """Writes `text` to `path` whole or not at all: to a temporary file renamed over `path`, or,
    on an object store, as one object write (atomic when the upload completes at close)."""
    if not is_local(path):
        with tf.io.gfile.GFile(path, "w") as f:
            f.write(text)
        return
    # Unique per writer, not per process: two writers in one process (threads) must not share it.
    tmp = f"{path}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    with tf.io.gfile.GFile(tmp, "w") as f:
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


def list_files(root):
    """The relative paths of every file below the directory `root` (tf.io.gfile), sorted."""
    root = os.fspath(root).rstrip("/")
    found = []
    for directory, _, names in tf.io.gfile.walk(root):
        relative = directory[len(root):].strip("/")
        found += [f"{relative}/{name}" if relative else name for name in names]
    return sorted(found)


def copy_tree(source, target, last=(), overwrite=False):
    """Copies every file below `source` to the same relative path below `target` (tf.io.gfile),
    the relative paths in `last` after all the others, in that order; returns the relative paths
    in the order copied. `overwrite=False` refuses (tf.errors.AlreadyExistsError) to replace a
    file. On an object store each object appears whole once copied, so a reader that waits for
    the `last` names never sees the others missing."""
    source, target = os.fspath(source), os.fspath(target)
    files = list_files(source)
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
    """A directory built under a temporary name and published whole at `final` (never over
    anything: `final` must be absent or an empty directory).

        with StagedDirectory(final, "export") as staged:
            write_everything(staged.path)
            staged.publish(last=("saved_model.pb",))

    `path` is a fresh name readers ignore (".tmp-<kind>-<name>-<random>"): beside `final` on a
    local disk, where `publish` is one rename (atomic on POSIX); in a local temporary directory
    for an object store, where `publish` uploads the tree with `last` copied last (see the module
    docstring) and removes what it uploaded if it fails midway, so no partial `final` stays
    behind. Whatever happens, nothing of the temporary name is left when the block ends. The
    object store gives no exclusivity: two writers publishing the same `final` at once are not
    kept apart there (locally the second rename fails).
    """

    def __init__(self, final, kind):
        self.final = os.fspath(final).rstrip("/")
        parent, name = os.path.split(self.final)
        tag = f".tmp-{kind}-{name}-{secrets.token_hex(4)}"
        self._local_root = None
        if is_local(self.final):
            self.path = os.path.join(parent, tag)
        else:
            # Built on the local disk and uploaded once: gfile lists a local tree reliably, and a
            # killed run leaves nothing in the bucket.
            self._local_root = tempfile.mkdtemp(prefix="tfxl-staging-")
            self.path = os.path.join(self._local_root, tag)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        remove_quietly(self.path)
        if self._local_root is not None:
            shutil.rmtree(self._local_root, ignore_errors=True)
        return False

    def publish(self, last=()):
        """Makes the staged tree `final`; FileExistsError (nothing changed) when `final` already
        holds something."""
        if _holds_something(self.final):
            raise FileExistsError(f"{self.final} already exists")
        if is_local(self.final):
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
