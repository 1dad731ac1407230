"""A split's tokens as one array, in corpus order: the streams' records read one after another
(each stream is a contiguous piece of the split, `tfxl.data.segments.stream_bounds`), for what
reads a split as text rather than as batches (e.g. tfxl.analysis)."""

import numpy as np

from tfxl.data import records
from tfxl.data.errors import DataError
from tfxl.data.manifest import load_manifest, split_info
from tfxl.deferred import deferred_import

tf = deferred_import("tensorflow")

__all__ = ["MAX_SPLIT_TOKENS", "split_tokens"]

# The most tokens read into memory (int32: 1 GiB), checked against the manifest before reading.
MAX_SPLIT_TOKENS = 1 << 28


def split_tokens(data_dir, split, *, manifest=None, max_tokens=MAX_SPLIT_TOKENS):
    """The tokens of `split` of the tfxl-prepare directory `data_dir`: int32 [N], N the
    manifest's token count for the split. DataError naming the split when it is missing, larger
    than `max_tokens`, or its records do not add up to the manifest's count."""
    manifest = manifest or load_manifest(data_dir)
    info = split_info(manifest, split)
    if info["tokens"] > max_tokens:
        raise DataError(f"{data_dir}: split {split!r} holds {info['tokens']} tokens, more than "
                        f"the {max_tokens} read at once")
    tgt_len = manifest["tgt_len"]
    pieces = []
    for stream in info["streams"]:
        path = tf.io.gfile.join(data_dir, stream["file"])
        for record in tf.data.TFRecordDataset(path):
            parsed = records.parse(record, tgt_len)
            length = int(parsed["length"])
            pieces.append(parsed["tokens"].numpy()[1:1 + length].astype(np.int32))
    tokens = np.concatenate(pieces) if pieces else np.zeros([0], np.int32)
    if tokens.size != info["tokens"]:
        raise DataError(f"{data_dir}: split {split!r} records hold {tokens.size} tokens, the "
                        f"manifest says {info['tokens']}")
    return tokens
