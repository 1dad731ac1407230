"""The segment record: one `tf.train.Example` per segment, all features int64.

=========== ======= ==========================================================
``tokens``  [T+1]   inputs = tokens[:T], targets = tokens[1:]; ``<pad>`` after
                    the segment's real tokens
``length``  []      number of real targets, 1..T
``reset``   []      1 when the segment starts a stream or a document
``stream``  []      s, the stream the segment belongs to
``position`` []     segment index inside the stream
=========== ======= ==========================================================

The one description of this layout: `tfxl-prepare` writes records with `encode`, describes them
in the manifest with `manifest_entry`, and `input_fn` reads them with `parse`.
"""

from __future__ import annotations

import numpy as np

from tfxl.deferred import deferred_import

tf = deferred_import("tensorflow")  # imported on first use: not by the tools' --help

# Feature name -> shape given T (tgt_len), in the order the manifest lists them.
_SHAPES = {"tokens": lambda T: [T + 1], "length": lambda T: [], "reset": lambda T: [],
           "stream": lambda T: [], "position": lambda T: []}


def manifest_entry(tgt_len: int) -> dict:
    """The manifest's ``record`` field: record type, compression, feature dtypes and shapes."""
    return {"type": "tf.train.Example", "compression": None,
            "features": {name: ["int64", shape(tgt_len)] for name, shape in _SHAPES.items()}}


def feature_spec(tgt_len: int) -> dict:
    """`tf.io.parse_single_example`'s spec of one record."""
    return {name: tf.io.FixedLenFeature(shape(tgt_len), tf.int64)
            for name, shape in _SHAPES.items()}


def encode(tokens: np.ndarray, tgt_len: int, pad_id: int, reset: int, stream: int,
           position: int) -> bytes:
    """One serialized record; `tokens` holds the segment's length+1 real tokens."""

    padded = np.full(tgt_len + 1, pad_id, dtype=np.int64)
    padded[:tokens.size] = tokens

    def ints(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))

    return tf.train.Example(features=tf.train.Features(feature={
        "tokens": ints(padded.tolist()), "length": ints([tokens.size - 1]),
        "reset": ints([reset]), "stream": ints([stream]), "position": ints([position]),
    })).SerializeToString(deterministic=True)  # features in name order: same bytes every run


def parse(record, tgt_len: int) -> dict:
    """A serialized record (scalar tf.string) -> dict of int64 tensors, as `encode` wrote it."""
    return tf.io.parse_single_example(record, feature_spec(tgt_len))
