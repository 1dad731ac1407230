"""tfxl.data: tokenizers, `tfxl-prepare` and the TFRecord segment pipeline.

Shape glossary used throughout the package:

* ``B``: global batch size (rows per step over all replicas); ``b`` is the
  per-replica batch, ``B = b * num_replicas``.
* ``T``: ``tgt_len``, tokens per segment.
* ``S``: ``num_streams``, contiguous streams each split is cut into.

Public API (imported lazily, so ``import tfxl.data`` does not load TensorFlow):
`input_fn`, `InputParams`, `eval_steps`, `verify_shards` (pipeline),
`load_manifest`, `check_manifest` (manifest), `load_tokenizer`,
`tokenizer_from_spec` (tokenizers), `PrepareConfig` (options: tfxl-prepare's options,
each declared once; run it with `tfxl.data.prepare.prepare`) and `DataError`.
Modules: `records` (the segment record), `sources`, `formats`, `segments`,
`staging` (tfxl-prepare's parts). Every user-given path goes through `tf.io.gfile`
(`tfxl.files`): ``gs://`` works like a local path.
The package knows nothing about the model; see docs/data.md.
"""

import importlib

from tfxl.data.errors import DataError

_LAZY = {
    "input_fn": "pipeline", "InputParams": "pipeline", "eval_steps": "pipeline",
    "load_tokenizer": "tokenizers", "verify_shards": "pipeline", "load_manifest": "manifest",
    "check_manifest": "manifest",
    "tokenizer_from_spec": "tokenizers", "PrepareConfig": "options",
}

__all__ = ["DataError", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f"tfxl.data.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'tfxl.data' has no attribute {name!r}")
