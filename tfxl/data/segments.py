"""Cutting a split's token sequence into S streams and each stream into segments of T targets.

The tokens of a split (with ``<eod>`` before each document) are first written to a flat
temporary file; `stream_bounds` cuts it into near-equal streams that share one token, and
`iter_segments` yields a stream's segments, never crossing a document start.
"""

from __future__ import annotations

from typing import List

import numpy as np


class TokenReader:
    """Reads [start, stop) of the flat token file through a block cache."""

    BLOCK = 1 << 20

    def __init__(self, path: str, dtype):
        self.path, self.dtype = path, np.dtype(dtype)
        self.block_start, self.block = 0, np.zeros(0, self.dtype)

    def read(self, start: int, stop: int) -> np.ndarray:
        if start < self.block_start or stop > self.block_start + self.block.size:
            count = max(self.BLOCK, stop - start)
            self.block = np.fromfile(self.path, dtype=self.dtype, count=count,
                                     offset=start * self.dtype.itemsize)
            self.block_start = start
        return self.block[start - self.block_start:stop - self.block_start]


def stream_bounds(total_positions: int, num_streams: int) -> List[int]:
    """Cut points c_0..c_S; stream s covers positions [c_s, c_{s+1}] (one shared token).

    The token at c_{s+1} is stream s's last target and stream s+1's first
    input, so targets (c_s, c_{s+1}] partition all positions but the first.
    """
    last = total_positions - 1
    return [round(s * last / num_streams) for s in range(num_streams + 1)]


def iter_segments(reader: TokenReader, first: int, last: int, doc_starts: np.ndarray,
                  tgt_len: int):
    """Yields (tokens [len+1], reset) for the stream covering positions [first, last].

    A segment has up to T targets and never crosses a document start: the
    ``<eod>`` at a document start is only ever an input, so a new document
    starts a new segment with reset=1 (the previous one is padded).
    """
    position, reset = first, 1
    while position < last:
        following = np.searchsorted(doc_starts, position, side="right")
        next_doc = int(doc_starts[following]) if following < doc_starts.size else None
        end = min(position + tgt_len, last)
        if next_doc is not None and next_doc <= last:
            end = min(end, next_doc - 1)
        if end > position:
            yield reader.read(position, end + 1), reset
            reset = 0
        if next_doc is not None and end == next_doc - 1:
            position, reset = next_doc, 1
        else:
            position = end


def shard_name(split: str, stream: int, num_streams: int) -> str:
    return f"{split}-stream-{stream:05d}-of-{num_streams:05d}.tfrecord"
