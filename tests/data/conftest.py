"""Shared helpers for the data tests (small corpora, tiny tokenizer models)."""

import os
import struct

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from tfxl.data import prepare as prepare_lib  # noqa: E402


def _varint(n):
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number, wire, payload):
    key = _varint((number << 3) | wire)
    if wire == 0:
        return key + _varint(payload)
    if wire == 5:
        return key + struct.pack("<f", payload)
    return key + _varint(len(payload)) + payload


def tiny_sentencepiece_model(words):
    """Serialises a unigram sentencepiece ModelProto by hand (no trainer offline).

    Pieces: <unk>, <s>, </s>, the word-start mark, every character of `words`
    and one whole-word piece per word, so any text over those characters
    round-trips exactly.
    """
    pieces = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3), ("\u2581", -2.0, 1)]
    pieces += [(ch, -3.0, 1) for ch in sorted({c for w in words for c in w})]
    pieces += [("\u2581" + w, -1.0, 1) for w in sorted(set(words))]
    body = b"".join(_field(1, 2, _field(1, 2, p.encode()) + _field(2, 5, s) + _field(3, 0, t))
                    for p, s, t in pieces)
    trainer = _field(3, 0, 1)  # model_type = UNIGRAM
    normalizer = (_field(1, 2, b"identity") + _field(3, 0, 1) + _field(4, 0, 1)
                  + _field(5, 0, 1))
    return body + _field(2, 2, trainer) + _field(3, 2, normalizer)


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


@pytest.fixture
def write(tmp_path):
    """write(name, data) -> path of a file in the test's temporary directory."""
    def _write(name, data):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
        return str(path)
    return _write


def run_prepare(output_dir, **kwargs):
    """prepare() with quiet logging; returns the manifest."""
    config = prepare_lib.PrepareConfig(output_dir=str(output_dir), **kwargs)
    return prepare_lib.prepare(config, log=lambda *_: None)


def run_cli(argv, capsys):
    """Runs tfxl-prepare's flag parsing + main in-process; returns (code, stderr)."""
    from absl import flags

    values = flags.FlagValues()
    prepare_lib.define_flags(values)
    values(["tfxl-prepare"] + list(argv))
    code = prepare_lib.main_with_flags(values, ["tfxl-prepare"])
    return code, capsys.readouterr().err


def split_targets(data_dir, manifest, split):
    """All (stream, position) -> (targets, mask) read straight from the shards."""
    import tensorflow as tf

    T = manifest["tgt_len"]
    spec = {"tokens": tf.io.FixedLenFeature([T + 1], tf.int64),
            "length": tf.io.FixedLenFeature([], tf.int64),
            "reset": tf.io.FixedLenFeature([], tf.int64),
            "stream": tf.io.FixedLenFeature([], tf.int64),
            "position": tf.io.FixedLenFeature([], tf.int64)}
    out = []
    for info in manifest["splits"][split]["streams"]:
        path = os.path.join(data_dir, info["file"])
        for record in tf.data.TFRecordDataset(path):
            ex = {k: v.numpy() for k, v in tf.io.parse_single_example(record, spec).items()}
            out.append(ex)
    return out
