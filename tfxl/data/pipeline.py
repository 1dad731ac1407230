"""`input_fn`: the TFRecord segment pipeline (Estimator/Orbit style).

Shapes: B global batch, b per-replica batch (``B = b * replicas``), T
tgt_len, S num_streams.

Slot -> stream layout
---------------------
Global batch slot g (0 <= g < B) reads streams g, g+B, g+2B, ... one after
the other, each from its first segment to its last, so a slot always sees
consecutive segments of one stream and ``reset=1`` marks where it moves on to
the next stream (or, for document-keeping data, to the next document).
Replica r owns global slots r*b .. r*b+b-1 (row j of its batch is slot
r*b + j).  One TFRecord file holds one stream, so an input pipeline opens only
the files of its own replicas' slots.

``params`` is an `InputParams` (a misspelt field is a TypeError, not a silently ignored key).

* ``input_fn(split, params)`` (no input context) builds all B slots: a global
  batch [B, ...] for `strategy.experimental_distribute_dataset`, which hands
  rows r*b .. r*b+b-1 to replica r.
* ``input_fn(split, params, input_context)`` (for
  `strategy.distribute_datasets_from_function`) builds only the slots of the
  replicas fed by pipeline ``input_context.input_pipeline_id`` (replicas
  i*R/P .. (i+1)*R/P-1, the worker-major order of Mirrored/MultiWorker
  strategies) and yields their per-replica batches [b, ...] in replica order,
  which the strategy distributes round-robin over its local replicas.
  Auto-sharding is OFF there: we already sharded.

Training (``params.training=True``): B must divide S; every slot repeats
its streams forever.  Pass p > 0 starts every stream ``shift_p`` tokens later
(1 <= shift_p < T, from p and the seed), the paper's ``num_passes`` idea: the
segment boundaries, and the tokens that only ever appear as context, change
between passes.  Data whose documents start inside streams is never shifted
(a shifted segment would straddle a memory reset).

Evaluation: no repeat, no shift.  The last segment of a stream is padded and
masked, and slots that run out of streams early get all-masked padding
segments (``stream=-1``) so every replica runs the same number of steps with
static shapes; each token of the split is a target with mask 1 exactly once.

Features (all int32): ``inputs`` [b, T], ``targets`` [b, T], ``target_mask``
[b, T] (1 = real target, 0 = padding; multiply the per-token loss by it),
``reset`` [b] (1 = clear this row's memory BEFORE this segment), ``stream``
[b] and ``position`` [b] (segment index inside the stream; -1 for padding).
"""

from __future__ import annotations

import dataclasses
import os
from typing import List, Optional, Sequence

import numpy as np
import tensorflow as tf

from tfxl.data import records
from tfxl.data.errors import DataError
from tfxl.data.manifest import check_manifest, load_manifest, split_info
from tfxl.files import reason

FEATURES = ("inputs", "targets", "target_mask", "reset", "stream", "position")


@dataclasses.dataclass(frozen=True)
class InputParams:
    """What `input_fn` reads and how.

    tgt_len, num_streams, vocab_sha256: when set, checked against the manifest before anything
    is read (a `DataError` names both values).
    """

    data_dir: str
    batch_size: int                   # the GLOBAL batch B
    training: bool = False
    seed: int = 0                     # varies the shift of later training passes
    shift_passes: bool = True         # training: pass p > 0 starts streams shift_p tokens later
    verify_shards: bool = True        # size + CRC check of this pipeline's shards before reading
    tgt_len: Optional[int] = None
    num_streams: Optional[int] = None
    vocab_sha256: Optional[str] = None


def slot_streams(slot: int, global_batch_size: int, num_streams: int) -> List[int]:
    """Streams read by global batch slot `slot`, in reading order."""
    return list(range(slot, num_streams, global_batch_size))


def eval_steps(manifest: dict, split: str, global_batch_size: int) -> int:
    """Steps that one evaluation pass over `split` takes (same on every replica)."""
    streams = split_info(manifest, split)["streams"]
    return max(sum(streams[s]["segments"] for s in slot_streams(g, global_batch_size, len(streams)))
               for g in range(global_batch_size))


def _record_count(path):
    """The records of the TFRecord file `path`, every length and data CRC checked."""
    return tf.data.TFRecordDataset(path).batch(4096).reduce(
        np.int64(0), lambda total, batch: total + tf.size(batch, out_type=tf.int64))


# `_record_count` traced once per process: called eagerly, `reduce` traced its function anew for
# every shard (~35 ms of a ~40 ms check), and every run checks each split's shards.
_count_records = tf.function(_record_count, input_signature=[tf.TensorSpec([], tf.string)])


def verify_shards(data_dir: str, streams: Sequence[dict], crc: bool = True,
                  records: str = "segments") -> None:
    """Checks shard files before reading them; a `DataError` names the bad shard.

    Always: the file exists and has the byte size recorded in the manifest
    (catches truncated copies and interrupted writes).  With ``crc=True`` (and
    eager execution) every record is read once so TFRecord's length and data
    CRCs are checked, and the record count must match the manifest (its field
    `records`: "segments" of a stream, "documents" of a classification shard).
    """
    for info in streams:
        path = os.path.join(data_dir, info["file"])
        try:
            size = tf.io.gfile.stat(path).length
        except tf.errors.NotFoundError:
            raise DataError(f"shard {path} is missing") from None
        except tf.errors.OpError as e:
            raise DataError(f"cannot read shard {path}: {reason(e, path)}") from None
        if size != info["bytes"]:
            raise DataError(f"shard {path} is truncated or modified: {size} bytes, the "
                            f"manifest says {info['bytes']}")
    if not (crc and tf.executing_eagerly()):
        return
    for info in streams:
        path = os.path.join(data_dir, info["file"])
        try:
            count = int(_count_records(tf.constant(path)))
        except tf.errors.DataLossError:
            try:  # again eagerly, for the op's own message ("corrupted record at 40")
                _record_count(path)
            except tf.errors.DataLossError as e:
                raise DataError(f"corrupt TFRecord shard {path}: "
                                f"{e.message.split('}}')[-1].strip().splitlines()[0]}") from None
            raise
        if count != info[records]:
            raise DataError(f"shard {path} has {count} records, the manifest says "
                            f"{info[records]}")


def _pass_shift(pass_index, tgt_len: int, seed: int):
    """0 for the first pass, else a pseudo-random 1..T-1 from (pass, seed)."""
    if tgt_len < 2:
        return tf.constant(0, tf.int32)
    mixed = (pass_index * 40503 + seed * 9973 + 7) % (tgt_len - 1)
    return tf.cast(tf.where(pass_index == 0, tf.constant(0, tf.int64), 1 + mixed), tf.int32)


def pipeline_options() -> tf.data.Options:
    """The tf.data options of tfxl's input pipelines (language model and classification).

    Deterministic order, and no autotuning thread. TensorFlow 2.21's autotuning thread
    (`options.autotune`) sleeps up to 60 s between optimisations, and deleting its iterator can
    miss waking it: `CancellationManager::StartCancel` runs the callback that wakes it before it
    sets the flag the thread then checks, so a thread that wakes in between sleeps on while the
    deleting thread waits for it (a stall of up to a minute wherever such an iterator is
    collected). The pipelines parse small records, so the tuning buys little: `AUTOTUNE` still
    means one parallel call per core and a prefetch buffer that the (threadless) prefetch
    autotuner grows
    (throughput: BENCHMARKS.md "Input pipelines", `benchmarks/input_bench.py`).
    """
    options = tf.data.Options()
    options.deterministic = True
    options.autotune.enabled = False
    return options


def input_fn(split: str, params: InputParams,
             input_context: Optional[tf.distribute.InputContext] = None) -> tf.data.Dataset:
    """Dataset of segment batches for `split` (see the module docstring and `InputParams`).

    Examples:

    ```python
    import os
    import tempfile

    from tfxl.data.options import PrepareConfig
    from tfxl.data.pipeline import InputParams, input_fn
    from tfxl.data.prepare import prepare

    root = tempfile.mkdtemp()
    with open(os.path.join(root, "corpus.txt"), "w") as corpus:
        corpus.write("def f(x): return x; " * 500)
    prepare(PrepareConfig(output_dir=os.path.join(root, "data"),
                          train=[os.path.join(root, "corpus.txt")], tokenizer="bytes",
                          tgt_len=16, num_streams=4), log=lambda *_: None)
    batches = input_fn("train", InputParams(data_dir=os.path.join(root, "data"), batch_size=4,
                                            training=True))
    batch = next(iter(batches))   # inputs, targets, target_mask [4, 16]; reset [4], ...
    ```
    """
    if not isinstance(params, InputParams):
        raise TypeError(f"input_fn: params must be an InputParams, not {type(params).__name__}")
    data_dir = params.data_dir
    global_batch = int(params.batch_size)
    training = bool(params.training)
    seed = int(params.seed)
    manifest = load_manifest(data_dir)
    check_manifest(manifest, tgt_len=params.tgt_len, num_streams=params.num_streams,
                   vocab_sha256=params.vocab_sha256,
                   global_batch_size=global_batch if training else None)
    if global_batch < 1:
        raise DataError(f"batch_size must be >= 1, got {global_batch}")
    info = split_info(manifest, split)
    T, S = manifest["tgt_len"], manifest["num_streams"]
    pad_id, vocab_size = manifest["pad_id"], manifest["vocab_size"]

    if input_context is not None:
        replicas = input_context.num_replicas_in_sync
        pipelines = input_context.num_input_pipelines
        if replicas % pipelines:
            raise DataError(f"{replicas} replicas cannot be split evenly over {pipelines} "
                            "input pipelines")
        per_replica = input_context.get_per_replica_batch_size(global_batch)
        local_replicas = replicas // pipelines
        first = input_context.input_pipeline_id * local_replicas * per_replica
        slots = list(range(first, first + local_replicas * per_replica))
    else:
        per_replica = global_batch
        slots = list(range(global_batch))

    streams_of_slot = [slot_streams(g, global_batch, S) for g in slots]
    own = sorted({s for streams in streams_of_slot for s in streams})
    if params.verify_shards:
        verify_shards(data_dir, [info["streams"][s] for s in own])

    max_streams = max(1, max(len(s) for s in streams_of_slot))
    file_table = tf.constant(
        [[os.path.join(data_dir, info["streams"][s]["file"]) for s in streams]
         + [""] * (max_streams - len(streams)) for streams in streams_of_slot], tf.string)
    stream_counts = tf.constant([len(s) for s in streams_of_slot], tf.int64)

    shift_passes = (training and params.shift_passes
                    and not info.get("resets_inside", False) and T > 1)
    positions = tf.range(T, dtype=tf.int32)

    def pad_segment():
        pads = tf.fill([T], tf.constant(pad_id, tf.int32))
        minus_one = tf.constant(-1, tf.int32)
        return {"inputs": pads, "targets": pads, "target_mask": tf.zeros([T], tf.int32),
                "reset": tf.constant(1, tf.int32), "stream": minus_one, "position": minus_one}

    def parse(record, filename):
        example = records.parse(record, T)
        tokens = example["tokens"]
        in_vocab = tf.reduce_all((tokens >= 0) & (tokens < vocab_size))
        check = tf.debugging.Assert(in_vocab, [
            f"token id outside the vocabulary [0, {vocab_size}) in shard", filename,
            "max id:", tf.reduce_max(tokens), "min id:", tf.reduce_min(tokens)])
        with tf.control_dependencies([check]):
            tokens = tf.cast(tokens, tf.int32)
        real = positions < tf.cast(example["length"], tf.int32)
        pads = tf.fill([T], tf.constant(pad_id, tf.int32))
        return {"inputs": tf.where(real, tokens[:T], pads),
                "targets": tf.where(real, tokens[1:], pads),
                "target_mask": tf.cast(real, tf.int32),
                "reset": tf.cast(example["reset"], tf.int32),
                "stream": tf.cast(example["stream"], tf.int32),
                "position": tf.cast(example["position"], tf.int32)}

    def stream_dataset(filename, shift=None):
        segments = tf.data.TFRecordDataset(filename, buffer_size=1 << 18).map(
            lambda record: parse(record, filename))
        if shift is None:
            return segments
        # Shifted pass: segment k becomes the last T-shift positions of k
        # followed by the first `shift` of k+1 (padding after the last one).
        following = segments.skip(1).concatenate(tf.data.Dataset.from_tensors(pad_segment()))

        def join(current, nxt):
            out = dict(current)
            for key in ("inputs", "targets", "target_mask"):
                out[key] = tf.concat([current[key][shift:], nxt[key][:shift]], 0)
            return out

        return tf.data.Dataset.zip((segments, following)).map(join).filter(
            lambda seg: tf.reduce_any(seg["target_mask"] > 0))

    def slot_files(local_slot):
        return file_table[local_slot][:stream_counts[local_slot]]

    if training:
        def slot_dataset(local_slot):
            files = slot_files(local_slot)

            def one_pass(pass_index):
                shift = _pass_shift(pass_index, T, seed) if shift_passes else None
                return tf.data.Dataset.from_tensor_slices(files).flat_map(
                    lambda f: stream_dataset(f, shift))

            return tf.data.Dataset.counter().flat_map(one_pass)
    else:
        steps = eval_steps(manifest, split, global_batch)
        padding = tf.constant(
            [steps - sum(info["streams"][s]["segments"] for s in streams)
             for streams in streams_of_slot], tf.int64)

        def slot_dataset(local_slot):
            segments = tf.data.Dataset.from_tensor_slices(slot_files(local_slot)).flat_map(
                stream_dataset)
            return segments.concatenate(
                tf.data.Dataset.from_tensors(pad_segment()).repeat(padding[local_slot]))

    # Round-robin over the local slots, one segment each: consecutive elements
    # are slots 0, 1, ..., n-1, 0, 1, ... so batching b elements gives replica
    # 0's rows, then replica 1's rows, ...  Every slot yields the same number of
    # elements (infinite for training, `steps` for evaluation), so the cycle
    # never loses alignment.
    dataset = tf.data.Dataset.range(len(slots)).interleave(
        slot_dataset, cycle_length=len(slots), block_length=1,
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    dataset = dataset.batch(per_replica, drop_remainder=True)
    if not training:
        # Its length, which interleave hides: Keras reads an unknown length's end as "Your
        # input ran out of data" (a warning at the end of every evaluate() pass).
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(
            steps * len(slots) // per_replica))
    options = pipeline_options()
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.OFF if input_context is not None
        else tf.data.experimental.AutoShardPolicy.DATA)
    return dataset.with_options(options).prefetch(tf.data.AUTOTUNE)
