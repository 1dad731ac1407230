"""input_fn on one device: eval coverage, stream alignment, shifted passes, errors."""

import dataclasses
import os

import numpy as np
import pytest
import tensorflow as tf

from data_helpers import run_prepare, sample_text
from tfxl.data.errors import DataError
from tfxl.data.manifest import load_manifest
from tfxl.data.pipeline import InputParams, _pass_shift, eval_steps, input_fn, slot_streams

T = 8


@pytest.fixture(scope="module")
def bytes_dir(tmp_path_factory):
    """Bytes data, 6 streams of uneven length (tokens not a multiple of T)."""
    root = tmp_path_factory.mktemp("pipe")
    text = sample_text(120, seed=11)
    for name, body in (("train.txt", text), ("valid.txt", text[:1001])):
        (root / name).write_text(body, encoding="utf-8")
    out = root / "data"
    run_prepare(out, train=[str(root / "train.txt")], valid=[str(root / "valid.txt")],
                tgt_len=T, num_streams=6)
    return str(out), text


def collect(dataset, steps=None):
    """Stacks up to `steps` batches: dict of arrays [steps, b, ...]."""
    rows = {}
    for i, batch in enumerate(dataset):
        if steps is not None and i >= steps:
            break
        for key, value in batch.items():
            rows.setdefault(key, []).append(value.numpy())
    return {k: np.stack(v) for k, v in rows.items()}


def stream_sequences(data_dir, split):
    """Per stream, its full token sequence (inputs then the final target), via eval."""
    manifest = load_manifest(data_dir)
    batches = collect(input_fn(split, InputParams(data_dir=data_dir, batch_size=1, training=False)))
    seqs = {}
    for step in range(batches["stream"].shape[0]):
        s = int(batches["stream"][step, 0])
        n = int(batches["target_mask"][step, 0].sum())
        seqs.setdefault(s, []).append(
            (batches["inputs"][step, 0, :n], batches["targets"][step, 0, n - 1]))
    out = {}
    for s, segs in seqs.items():
        out[s] = np.concatenate([i for i, _ in segs] + [[segs[-1][1]]])
    assert len(out) == manifest["num_streams"]
    return out


def test_eval_reads_every_token_exactly_once(bytes_dir):
    data_dir, text = bytes_dir
    manifest = load_manifest(data_dir)
    for batch_size in (4, 6, 1):   # 4 does not divide the 6 streams: padded slots
        batches = collect(input_fn("valid", InputParams(data_dir=data_dir, batch_size=batch_size,
                                             training=False)))
        steps = eval_steps(manifest, "valid", batch_size)
        assert batches["inputs"].shape == (steps, batch_size, T)
        assert all(batches[k].dtype == np.int32 for k in batches)
        mask = batches["target_mask"]
        assert int(mask.sum()) == manifest["splits"]["valid"]["tokens"] == len(text[:1001].encode())
        # Reassemble the split from (stream, position) -> masked targets.
        seen = {}
        for step in range(steps):
            for row in range(batch_size):
                key = (int(batches["stream"][step, row]), int(batches["position"][step, row]))
                if key[0] < 0:
                    assert mask[step, row].sum() == 0 and batches["reset"][step, row] == 1
                    continue
                assert key not in seen, f"segment {key} read twice"
                seen[key] = batches["targets"][step, row][mask[step, row] == 1]
        tokens = np.concatenate([seen[k] for k in sorted(seen)])
        np.testing.assert_array_equal(tokens, np.frombuffer(text[:1001].encode(), np.uint8))
        # Padding targets are masked and set to <pad>.
        assert np.all(batches["targets"][mask == 0] == manifest["pad_id"])


def check_slots(batches, manifest, split, global_batch, first_slot=0, eval_padding=False):
    """Each batch row follows its slot's streams g, g+B, ... segment by segment."""
    streams = manifest["splits"][split]["streams"]
    steps, rows = batches["stream"].shape
    for row in range(rows):
        slot = first_slot + row
        expected = [(s, p) for s in slot_streams(slot, global_batch, len(streams))
                    for p in range(streams[s]["segments"])]
        if eval_padding:
            expected += [(-1, -1)] * (steps - len(expected))
        n = min(steps, len(expected))
        got = list(zip(batches["stream"][:n, row].tolist(), batches["position"][:n, row].tolist()))
        assert got == expected[:n], f"slot {slot}"
        resets = batches["reset"][:n, row].tolist()
        assert resets == [1 if p <= 0 else 0 for _, p in expected[:n]]


def test_training_slots_read_consecutive_segments_and_later_passes_shift(bytes_dir):
    data_dir, _ = bytes_dir
    manifest = load_manifest(data_dir)
    B, seed = 2, 5
    streams = manifest["splits"]["train"]["streams"]
    pass_len = [sum(streams[s]["segments"] for s in slot_streams(g, B, 6)) for g in range(B)]
    batches = collect(input_fn("train", InputParams(data_dir=data_dir, batch_size=B, training=True,
                                         seed=seed)), steps=max(pass_len) + 40)
    assert batches["inputs"].shape[1:] == (B, T)
    check_slots({k: v[:min(pass_len)] for k, v in batches.items()}, manifest, "train", B)
    # Pass 1 of slot 0 starts stream 0 again, `shift` tokens later.
    shift = int(_pass_shift(tf.constant(1, tf.int64), T, seed))
    assert 1 <= shift < T
    seqs = stream_sequences(data_dir, "train")
    start = pass_len[0]
    assert batches["stream"][start, 0] == 0 and batches["reset"][start, 0] == 1
    for k in range(10):
        step = start + k
        assert batches["position"][step, 0] == k
        np.testing.assert_array_equal(batches["inputs"][step, 0],
                                      seqs[0][shift + k * T: shift + k * T + T])
        np.testing.assert_array_equal(batches["targets"][step, 0],
                                      seqs[0][shift + k * T + 1: shift + k * T + T + 1])
        assert batches["target_mask"][step, 0].all()


def test_input_context_builds_only_its_replicas_slots(bytes_dir):
    data_dir, _ = bytes_dir
    manifest = load_manifest(data_dir)
    # 3 replicas over 3 pipelines, global batch 6 = 3 x 2; pipeline 1 owns slots 2, 3.
    context = tf.distribute.InputContext(num_input_pipelines=3, input_pipeline_id=1,
                                         num_replicas_in_sync=3)
    params = InputParams(data_dir=data_dir, batch_size=6, training=False)
    batches = collect(input_fn("valid", params, context))
    assert batches["inputs"].shape[1:] == (2, T)
    check_slots(batches, manifest, "valid", 6, first_slot=2, eval_padding=True)
    # One pipeline feeding 2 replicas yields replica 0's batch then replica 1's.
    context = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                         num_replicas_in_sync=2)
    batches = collect(input_fn("train", InputParams(data_dir=data_dir, batch_size=6, training=True),
                               context), steps=8)
    assert batches["stream"][:2].tolist() == [[0, 1, 2], [3, 4, 5]]


def test_deterministic_order(bytes_dir):
    data_dir, _ = bytes_dir
    params = InputParams(data_dir=data_dir, batch_size=3, training=True, seed=1)
    first = collect(input_fn("train", params), steps=60)
    second = collect(input_fn("train", params), steps=60)
    for key in first:
        np.testing.assert_array_equal(first[key], second[key])


def test_pipelines_run_without_the_autotuning_thread(bytes_dir):
    # TF 2.21's autotuning thread is not woken when its iterator is deleted: deleting an iterator
    # read for a minute blocked for up to 60 s (pipeline_options, benchmarks/input_bench.py).
    data_dir, _ = bytes_dir
    for training in (True, False):
        dataset = input_fn("train", InputParams(data_dir=data_dir, batch_size=3,
                                                training=training))
        assert dataset.options().autotune.enabled is False
        assert dataset.options().deterministic is True


def test_flag_and_manifest_mismatches_fail_before_reading(bytes_dir):
    data_dir, _ = bytes_dir
    base = InputParams(data_dir=data_dir, batch_size=4, training=True)
    with pytest.raises(DataError, match="global batch size 4 must divide num_streams=6"):
        input_fn("train", base)
    with pytest.raises(DataError, match="tgt_len mismatch.*tgt_len=16.*tgt_len=8"):
        input_fn("train", dataclasses.replace(base, batch_size=2, tgt_len=16))
    with pytest.raises(DataError, match="vocab_sha256 mismatch"):
        input_fn("train", dataclasses.replace(base, batch_size=2, vocab_sha256="f" * 64))
    with pytest.raises(DataError, match="split 'test' is not in the manifest"):
        input_fn("test", dataclasses.replace(base, batch_size=2))


def _copy_data(src, dst):
    os.makedirs(dst)
    for name in os.listdir(src):
        with open(os.path.join(src, name), "rb") as f, open(os.path.join(dst, name), "wb") as g:
            g.write(f.read())


def test_corrupt_shard_and_out_of_vocabulary_ids_name_the_shard(bytes_dir, tmp_path):
    data_dir, _ = bytes_dir
    copy = str(tmp_path / "copy")
    _copy_data(data_dir, copy)
    manifest = load_manifest(copy)
    shard = os.path.join(copy, manifest["splits"]["valid"]["streams"][2]["file"])
    data = bytearray(open(shard, "rb").read())
    data[40] ^= 0x01
    open(shard, "wb").write(bytes(data))
    params = InputParams(data_dir=copy, batch_size=2, training=False)
    with pytest.raises(DataError, match=f"corrupt TFRecord shard {shard}"):
        input_fn("valid", params)
    # A record whose token ids exceed the vocabulary (e.g. records from another
    # prepare copied in): the in-graph check names the shard.
    with tf.io.TFRecordWriter(shard) as writer:
        ints = lambda v: tf.train.Feature(int64_list=tf.train.Int64List(value=v))
        writer.write(tf.train.Example(features=tf.train.Features(feature={
            "tokens": ints([1] * T + [9999]), "length": ints([T]), "reset": ints([1]),
            "stream": ints([2]), "position": ints([0])})).SerializeToString())
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=f"(?s)outside the vocabulary.*{os.path.basename(shard)}"):
        collect(input_fn("valid", dataclasses.replace(params, verify_shards=False)))


def test_documents_reset_inside_streams_and_are_not_shifted(tmp_path):
    docs = []
    for d in range(4):
        path = tmp_path / f"news-{d}"
        path.write_text("\n".join(f"doc {d} line {i}" for i in range(15)) + "\n")
        docs.append(str(path))
    out = str(tmp_path / "lm")
    run_prepare(out, train=docs, format="lm1b", tokenizer="bytes", tgt_len=T, num_streams=2)
    manifest = load_manifest(out)
    streams = manifest["splits"]["train"]["streams"]
    per_pass = max(s["segments"] for s in streams)
    batches = collect(input_fn("train", InputParams(data_dir=out, batch_size=2, training=True)),
                      steps=2 * per_pass)
    eod = manifest["eod_id"]
    starts_doc = batches["inputs"][:, :, 0] == eod
    assert starts_doc.sum() >= 4
    # reset=1 exactly where a stream starts or a document begins.
    assert np.array_equal(batches["reset"] == 1, starts_doc | (batches["position"] == 0))
    # No shifting: pass 2 repeats pass 1 exactly.
    segments = streams[0]["segments"]
    np.testing.assert_array_equal(batches["inputs"][:segments, 0],
                                  batches["inputs"][segments:2 * segments, 0])


def test_rechunked_evaluation_still_counts_every_token_once(bytes_dir):
    from tfxl.data.rechunk import rechunk

    data_dir, text = bytes_dir
    manifest = load_manifest(data_dir)
    S = manifest["num_streams"]
    dataset = input_fn("valid", InputParams(data_dir=data_dir, batch_size=S, training=False))
    for new_len in (4, 2 * T):   # divides T, and a multiple of T
        batches = collect(rechunk(dataset, new_len))
        steps = -(-eval_steps(manifest, "valid", S) * T // new_len)
        assert batches["inputs"].shape == (steps, S, new_len)
        mask = batches["target_mask"]
        assert int(mask.sum()) == manifest["splits"]["valid"]["tokens"]
        # Row s is stream s: its masked targets, in order, then streams in order.
        tokens = np.concatenate([batches["targets"][:, s][mask[:, s] == 1] for s in range(S)])
        np.testing.assert_array_equal(tokens, np.frombuffer(text[:1001].encode(), np.uint8))
        assert batches["reset"][0].tolist() == [1] * S


def test_rechunk_of_two_replicas_batches_in_turn_equals_rechunk_of_the_global_batch(bytes_dir):
    """One pipeline feeding two local replicas yields their [3, T] batches in turn; re-cut, each
    replica must get its own rows of the re-cut global batch, still in turn."""
    from tfxl.data.rechunk import rechunk

    data_dir, _ = bytes_dir
    params = InputParams(data_dir=data_dir, batch_size=6, training=False)
    want = collect(rechunk(input_fn("valid", params), 4))  # [steps, 6, 4]
    context = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                         num_replicas_in_sync=2)
    got = collect(rechunk(input_fn("valid", params, context), 4, replicas=2))  # [2 steps, 3, 4]
    for key in ("inputs", "targets", "target_mask", "reset"):
        turns = got[key].reshape((-1, 2) + got[key].shape[1:])  # [steps, replica, 3, ...]
        np.testing.assert_array_equal(turns.reshape(want[key].shape), want[key], err_msg=key)


def test_input_params_refuse_a_misspelt_field(bytes_dir):
    data_dir, _ = bytes_dir
    with pytest.raises(TypeError, match="verify_shard"):
        InputParams(data_dir=data_dir, batch_size=2, verify_shard=False)
    with pytest.raises(TypeError, match="params must be an InputParams, not dict"):
        input_fn("valid", {"data_dir": data_dir, "batch_size": 2})
