"""tfxl.data: tokenizers, `tfxl-prepare` and the TFRecord segment pipeline.

Shape glossary used throughout the package:

* ``B``: global batch size (rows per step over all replicas); ``b`` is the
  per-replica batch, ``B = b * num_replicas``.
* ``T``: ``tgt_len``, tokens per segment.
* ``S``: ``num_streams``, contiguous streams each split is cut into.

The package knows nothing about the model; see docs/data.md for formats, the
manifest and the record layout.
"""

from tfxl.data.errors import DataError

__all__ = ["DataError"]
