"""Helpers of the data tests (small corpora, running tfxl-prepare, reading records back).

Imported as a module (`from data_helpers import ...`: pytest puts tests/data on sys.path; the name
is unique among the test directories); tests/data/conftest.py holds only fixtures.
"""

import os

import numpy as np

from tfxl import cli
from tfxl.data import prepare as prepare_lib
from tfxl.data import records


def sample_text(num_lines, seed=0):
    """Deterministic multi-line text with a Zipf-ish word distribution and non-ASCII."""
    rng = np.random.default_rng(seed)
    words = ["the", "a", "of", "cat", "dog", "sat", "on", "mat", "über", "naïve",
             "café", "zebra", "quick", "brown", "fox", "jumps", "lazy", "night"]
    weights = 1.0 / np.arange(1, len(words) + 1)
    weights /= weights.sum()
    lines = []
    for _ in range(num_lines):
        n = int(rng.integers(0, 12))
        lines.append(" ".join(rng.choice(words, size=n, p=weights)))
    return "\n".join(lines) + "\n"


def run_prepare(output_dir, progress=False, **kwargs):
    """prepare() with quiet logging; returns the manifest."""
    config = prepare_lib.PrepareConfig(output_dir=str(output_dir), **kwargs)
    return prepare_lib.prepare(config, log=lambda *_: None, progress=progress)


def run_cli(argv, capsys):
    """Runs tfxl-prepare's flag parsing + main in-process; returns (code, stderr)."""
    from absl import flags

    values = flags.FlagValues()
    prepare_lib.define_flags(values)
    values(["tfxl-prepare"] + list(argv))
    code = cli.exit_status(lambda argv: prepare_lib.main(argv, values), ["tfxl-prepare"])
    return code, capsys.readouterr().err


def split_targets(data_dir, manifest, split):
    """Every record of a split's shards, in stream order, as dicts of arrays."""
    import tensorflow as tf

    out = []
    for info in manifest["splits"][split]["streams"]:
        path = os.path.join(data_dir, info["file"])
        for record in tf.data.TFRecordDataset(path):
            parsed = records.parse(record, manifest["tgt_len"])
            out.append({k: v.numpy() for k, v in parsed.items()})
    return out
