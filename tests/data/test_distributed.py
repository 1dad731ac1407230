"""Stream alignment under a 2-replica MirroredStrategy (two logical CPUs).

Both `experimental_distribute_dataset(input_fn(split, params))` and
`distribute_datasets_from_function(lambda ctx: input_fn(split, params, ctx))`
must give replica r's batch row j the consecutive segments of the streams of
global slot g = r*b + j; we check the (stream, position) sequence of every
slot and reconstruct the original token sequence of the split from it.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from data_helpers import run_prepare, sample_text
from tfxl.data.manifest import load_manifest
from tfxl.data.pipeline import slot_streams

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
GLOBAL_BATCH, PER_REPLICA, T, S = 4, 2, 8, 8
# Every test reads the results of one worker process.
pytestmark = pytest.mark.subprocess


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    text = sample_text(150, seed=21)
    (root / "train.txt").write_text(text, encoding="utf-8")
    (root / "valid.txt").write_text(text[:1500], encoding="utf-8")
    data_dir = str(root / "data")
    run_prepare(data_dir, train=[str(root / "train.txt")], valid=[str(root / "valid.txt")],
                tgt_len=T, num_streams=S)
    out = str(root / "out.npz")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, os.path.join(HERE, "distributed_worker.py"),
                           data_dir, str(GLOBAL_BATCH), out],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(out) as arrays:
        return dict(arrays), load_manifest(data_dir), text


def slot_rows(arrays, method, split, key):
    """[steps, GLOBAL_BATCH] with column g = global slot g (replica g // b, row g % b)."""
    per_replica = [arrays[f"{method}/{split}/{r}/{key}"] for r in range(2)]
    return np.concatenate(per_replica, axis=1)


@pytest.mark.parametrize("method", ["experimental", "from_function"])
def test_each_replica_slot_reads_consecutive_segments_of_its_streams(results, method):
    arrays, manifest, _ = results
    assert arrays[f"{method}/train/0/targets"].shape[1:] == (PER_REPLICA, T)
    for split in ("train", "valid"):
        streams = slot_rows(arrays, method, split, "stream")
        positions = slot_rows(arrays, method, split, "position")
        resets = slot_rows(arrays, method, split, "reset")
        info = manifest["splits"][split]["streams"]
        for g in range(GLOBAL_BATCH):
            expected = [(s, p) for s in slot_streams(g, GLOBAL_BATCH, S)
                        for p in range(info[s]["segments"])]
            n = min(len(expected), streams.shape[0])
            assert list(zip(streams[:n, g].tolist(), positions[:n, g].tolist())) == expected[:n]
            assert resets[:n, g].tolist() == [int(p == 0) for _, p in expected[:n]]


@pytest.mark.parametrize("method", ["experimental", "from_function"])
def test_eval_reconstructs_the_split_exactly_once(results, method):
    arrays, manifest, text = results
    streams = slot_rows(arrays, method, "valid", "stream")
    positions = slot_rows(arrays, method, "valid", "position")
    mask = slot_rows(arrays, method, "valid", "target_mask")
    targets = slot_rows(arrays, method, "valid", "targets")
    seen = {}
    for step in range(streams.shape[0]):
        for g in range(GLOBAL_BATCH):
            key = (int(streams[step, g]), int(positions[step, g]))
            if key[0] < 0:
                assert mask[step, g].sum() == 0
                continue
            assert key not in seen
            seen[key] = targets[step, g][mask[step, g] == 1]
    assert int(mask.sum()) == manifest["splits"]["valid"]["tokens"]
    tokens = np.concatenate([seen[k] for k in sorted(seen)])
    np.testing.assert_array_equal(tokens, np.frombuffer(text[:1500].encode(), np.uint8))


def test_both_methods_agree(results):
    arrays, _, _ = results
    for key in ("stream", "position", "targets", "target_mask"):
        for split in ("train", "valid"):
            np.testing.assert_array_equal(slot_rows(arrays, "experimental", split, key),
                                          slot_rows(arrays, "from_function", split, key))
