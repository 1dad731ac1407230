"""Stream alignment under a 2-replica MirroredStrategy (two logical CPUs).

Both `experimental_distribute_dataset(input_fn(split, params))` and
`distribute_datasets_from_function(lambda ctx: input_fn(split, params, ctx))`
must give replica r's batch row j the consecutive segments of the streams of
global slot g = r*b + j; we check the (stream, position) sequence of every
slot and reconstruct the original token sequence of the split from it.
"""

import numpy as np
import pytest

from data_helpers import run_prepare, sample_text
from tfxl.data.manifest import load_manifest
from tfxl.data.pipeline import InputParams, input_fn, slot_streams

GLOBAL_BATCH, PER_REPLICA, T, S = 4, 2, 8, 8
KEYS = ("stream", "position", "reset", "targets", "target_mask")


def distributed_batches(strategy, data_dir):
    """{"<method>/<split>/<replica>/<key>": [steps, PER_REPLICA, ...]} for both methods
    (experimental_distribute_dataset, distribute_datasets_from_function): 40 training steps and
    one whole pass over valid."""
    results = {}
    for split, training, steps in (("train", True, 40), ("valid", False, None)):
        params = InputParams(data_dir=data_dir, batch_size=GLOBAL_BATCH, training=training)
        datasets = {
            "experimental": strategy.experimental_distribute_dataset(input_fn(split, params)),
            "from_function": strategy.distribute_datasets_from_function(
                lambda ctx, p=params, s=split: input_fn(s, p, ctx)),
        }
        for method, dist in datasets.items():
            per_replica = {(r, k): [] for r in range(2) for k in KEYS}
            for step, batch in enumerate(dist):
                if steps is not None and step >= steps:
                    break
                for k in KEYS:
                    for r, value in enumerate(strategy.experimental_local_results(batch[k])):
                        per_replica[(r, k)].append(value.numpy())
            for (r, k), values in per_replica.items():
                results[f"{method}/{split}/{r}/{k}"] = np.stack(values)
    return results


@pytest.fixture(scope="module")
def results(tmp_path_factory, mirrored):
    """The batches of both methods under the session's MirroredStrategy over two logical CPUs
    (tests/conftest.py makes them)."""
    root = tmp_path_factory.mktemp("dist")
    text = sample_text(150, seed=21)
    (root / "train.txt").write_text(text, encoding="utf-8")
    (root / "valid.txt").write_text(text[:1500], encoding="utf-8")
    data_dir = str(root / "data")
    run_prepare(data_dir, train=[str(root / "train.txt")], valid=[str(root / "valid.txt")],
                tgt_len=T, num_streams=S)
    assert mirrored.num_replicas_in_sync == 2
    return distributed_batches(mirrored, data_dir), load_manifest(data_dir), text


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
