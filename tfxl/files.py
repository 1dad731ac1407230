"""The files the tools read and write (configs, metrics, fingerprints, logs).

One place for the two rules every tool follows: a file that cannot be read or parsed is one
ValueError naming it, and a file is written whole or not at all, so a killed run never leaves half
a file (tf.io.gfile: local paths and GCS alike): on a file system it is written to a temporary name
and renamed over the old one; on an object store (gs://, s3://), which has no atomic rename (a
rename is a copy and a delete) but makes an object visible only once its upload completes, it is
written in one go. Directories of several files are staged as a whole instead
(tfxl/data/staging.py, tfxl-convert's output).
"""

import json
import os

import tensorflow as tf


def read_json(path, what):
    """A JSON file's object; ValueError naming the file when it cannot be read or parsed, or
    holds something other than an object."""
    try:
        with tf.io.gfile.GFile(path) as f:
            data = json.load(f)
    except (OSError, tf.errors.OpError) as err:
        raise ValueError(f"{what} {path}: cannot read ({err})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{what} {path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what} {path}: expected a JSON object")
    return data


OBJECT_STORES = ("gs://", "s3://")


def is_object_store(path):
    """Whether `path` names an object in a bucket (no append, no atomic rename)."""
    return str(path).startswith(OBJECT_STORES)


def write_text_atomically(path, text):
    """Writes `text` to `path` whole or not at all: to a temporary file renamed over `path`, or,
    on an object store, as one object write (atomic when the upload completes at close)."""
    if is_object_store(path):
        with tf.io.gfile.GFile(path, "w") as f:
            f.write(text)
        return
    tmp = f"{path}.tmp-{os.getpid()}"
    with tf.io.gfile.GFile(tmp, "w") as f:
        f.write(text)
    tf.io.gfile.rename(tmp, path, overwrite=True)


def write_json_atomically(path, payload):
    """Writes `payload` as indented JSON, atomically (write_text_atomically)."""
    write_text_atomically(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")
