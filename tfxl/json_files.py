"""JSON files the tools read and write (configs, manifests' companions, metrics, fingerprints).

One place for the two rules every tool follows: a file that cannot be read or parsed is one
ValueError naming it, and a file is written to a temporary name and renamed over the old one, so
a killed run never leaves half a file (tf.io.gfile: local paths and GCS alike).
"""

import json
import os

import tensorflow as tf


def read_json(path, what):
    """A JSON file's object; ValueError naming the file when it cannot be read or parsed."""
    try:
        with tf.io.gfile.GFile(path) as f:
            return json.load(f)
    except (OSError, tf.errors.OpError) as err:
        raise ValueError(f"{what} {path}: cannot read ({err})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{what} {path} is not valid JSON: {err}") from None


def write_json_atomically(path, payload):
    """Writes `payload` as indented JSON to a temporary file, then renames it over `path`."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with tf.io.gfile.GFile(tmp, "w") as f:
        f.write(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    tf.io.gfile.rename(tmp, path, overwrite=True)
