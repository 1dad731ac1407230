"""Which vocabulary a model belongs to: the one check shared by every tool that pairs a model with
a data directory (tfxl-train, tfxl-eval, tfxl-export, tfxl-generate).

The first training run stores the manifest's vocabulary hash in `model_dir/data.json`; an export
made with a tokenizer stores it in `<version>/assets.extra/tfxl_data.json` (TF Serving ignores
assets.extra). Another vocabulary of the same size would silently give wrong text, so it is
refused, as is another size. Imports no trainer code (serving uses it).
"""

import os

import tensorflow as tf

from tfxl.files import read_json, write_json_atomically

DATA_JSON = "data.json"
EXPORT_DATA_JSON = os.path.join("assets.extra", "tfxl_data.json")


def check_data_fingerprint(model_dir, manifest, data_dir, store=False):
    """Refuses data whose vocabulary differs from the one `model_dir` was trained (or exported)
    with; `store=True` records the manifest's when nothing is recorded yet (first training run).

    model_dir: a tfxl-train model_dir (data.json) or an export version directory.
    """
    path = os.path.join(model_dir, DATA_JSON)
    if not tf.io.gfile.exists(path):
        path = os.path.join(model_dir, EXPORT_DATA_JSON)
    if tf.io.gfile.exists(path):
        stored = read_json(path, "data fingerprint")
        recorded = stored.get("vocab_sha256")  # None: an export made without a tokenizer
        if recorded is not None and recorded != manifest["vocab_sha256"]:
            raise ValueError(
                f"--data_dir={data_dir} has another vocabulary (sha256 "
                f"{manifest['vocab_sha256'][:12]}...) than the one {model_dir} was trained on "
                f"({recorded[:12]}..., from {stored.get('data_dir')})")
    elif store:
        write_json_atomically(os.path.join(model_dir, DATA_JSON), {
            "vocab_sha256": manifest["vocab_sha256"], "vocab_size": manifest["vocab_size"],
            "tgt_len": manifest["tgt_len"], "data_dir": data_dir})


def check_vocab_size(manifest, data_dir, vocab_size, model):
    """A model over V ids cannot use a vocabulary of another size (vocab_size None: unknown)."""
    if vocab_size is not None and manifest["vocab_size"] != vocab_size:
        raise ValueError(f"--data_dir={data_dir} has a vocabulary of {manifest['vocab_size']} "
                         f"tokens but {model} was built for {vocab_size}")


def write_export_fingerprint(export_dir, vocab_size, vocab_sha256=None, data_dir=None):
    """Records next to an export its vocabulary size and, when it embeds a tokenizer, the
    tokenizer's hash (see the module docstring)."""
    tf.io.gfile.makedirs(os.path.dirname(os.path.join(export_dir, EXPORT_DATA_JSON)))
    write_json_atomically(os.path.join(export_dir, EXPORT_DATA_JSON), {
        "vocab_sha256": vocab_sha256, "vocab_size": vocab_size, "data_dir": data_dir})


def export_vocab_size(export_dir):
    """The vocabulary size an export recorded, or None (exports of older tfxl versions)."""
    path = os.path.join(export_dir, EXPORT_DATA_JSON)
    return read_json(path, "export record").get("vocab_size") if tf.io.gfile.exists(path) else None
