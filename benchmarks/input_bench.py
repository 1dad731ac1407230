"""Benchmark: tfxl's input pipelines with tf.data's autotuning thread off (tfxl's
`pipeline_options()`) against TensorFlow's default (on), interleaved in one run.

Two measurements per setting and round, on data `tfxl-prepare` made from a generated corpus:

* throughput: segment batches per second of the training `input_fn` (global batch B, T) and of
  the classification pipeline (`classification_dataset`, documents of the same corpus), read as
  fast as the host gives them, after a warm-up;
* deletion: an iterator of the training pipeline is read at a steady pace (one batch every
  `--pace` seconds, as a training step would) for `--life` seconds, then deleted; the seconds the
  deletion blocks the deleting thread. TensorFlow 2.21's autotuning thread sleeps up to 60 s
  between optimisations and a race can leave it asleep through the deletion (BUILD.md
  "Tests"), so with autotuning on this can take up to a minute; the race is lost only
  sometimes.

    python -m benchmarks.input_bench [--rounds 2] [--life 70] [--json out.json]

Not a timed test; the numbers go to BENCHMARKS.md ("Input pipelines").
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time

from benchmarks import common

SETTINGS = ("autotune_off", "autotune_on")  # tfxl's options; TensorFlow's default


def with_setting(dataset, setting):
    import tensorflow as tf
    if setting == "autotune_off":
        return dataset  # tfxl's pipelines set it themselves
    options = tf.data.Options()
    options.autotune.enabled = True
    return dataset.with_options(options)


def training_pipeline(data_dir, batch, setting):
    from tfxl.data.pipeline import InputParams, input_fn
    return with_setting(input_fn("train", InputParams(data_dir, batch, training=True)), setting)


def classification_pipeline(data_dir, batch, tgt_len, setting):
    from tfxl.data.classification import classification_dataset
    return with_setting(classification_dataset(data_dir, "train", batch, tgt_len, repeat=True,
                                               shuffle=True, max_tokens=4 * tgt_len,
                                               pad_to_max_tokens=True), setting)


def batches_per_second(dataset, batches, warmup=10):
    iterator = iter(dataset)
    for _ in range(warmup):
        next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    seconds = time.perf_counter() - start
    del iterator
    return batches / seconds


def deletion_seconds(dataset, life, pace):
    iterator = iter(dataset)
    end = time.monotonic() + life
    while time.monotonic() < end:
        next(iterator)
        time.sleep(pace)
    start = time.perf_counter()
    del iterator
    gc.collect()
    return time.perf_counter() - start


def classification_data(tmp, corpus_dir, tgt_len):
    """Documents of the generated corpus (its lines grouped 50 at a time, labelled by group
    parity) prepared with `prepare_classification` and the bytes tokenizer."""
    from tfxl.data.classification import ClassificationConfig, prepare_classification
    out = os.path.join(tmp, "classification")
    if os.path.exists(os.path.join(out, "manifest.json")):
        return out
    with open(os.path.join(corpus_dir, "corpus.txt"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    jsonl = os.path.join(tmp, "documents.jsonl")
    with open(jsonl, "w") as f:
        for i in range(0, len(lines), 50):
            f.write(json.dumps({"text": "\n".join(lines[i:i + 50]),
                                "label": "even" if i // 50 % 2 == 0 else "odd"}) + "\n")
    prepare_classification(ClassificationConfig(output_dir=out, train=[jsonl], format="jsonl",
                                                valid_fraction=0.0, test_fraction=0.0))
    return out


def main(argv=None):
    parser = common.add_common_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=16, help="global batch B")
    parser.add_argument("--tgt_len", type=int, default=512, help="T")
    parser.add_argument("--mb", type=int, default=8, help="corpus size")
    parser.add_argument("--life", type=float, default=70.0,
                        help="seconds an iterator is read before it is deleted")
    parser.add_argument("--pace", type=float, default=0.05, help="seconds between batches")
    args = parser.parse_args(argv)
    common.setup(args)
    results = {"machine": common.machine_info(), "args": vars(args),
               **{s: {"train_batches_per_s": [], "classification_batches_per_s": [],
                      "deletion_s": []} for s in SETTINGS}}
    with common.temp_dir() as tmp:
        data = common.prepare_data(tmp, args.tgt_len, args.mb)
        documents = classification_data(tmp, tmp, args.tgt_len)
        for r in range(args.rounds):
            for setting in SETTINGS if r % 2 == 0 else SETTINGS[::-1]:  # interleaved
                entry = results[setting]
                entry["train_batches_per_s"].append(batches_per_second(
                    training_pipeline(data, args.batch, setting), args.batches))
                entry["classification_batches_per_s"].append(batches_per_second(
                    classification_pipeline(documents, args.batch, args.tgt_len, setting),
                    args.batches // 4))
                entry["deletion_s"].append(deletion_seconds(
                    training_pipeline(data, args.batch, setting), args.life, args.pace))
                print(f"round {r} {setting:>12}: train "
                      f"{entry['train_batches_per_s'][-1]:,.0f} batches/s, classification "
                      f"{entry['classification_batches_per_s'][-1]:,.0f} batches/s, deleting "
                      f"an iterator read for {args.life:.0f} s: {entry['deletion_s'][-1]:.2f} s",
                      flush=True)
    common.dump_json(args.json, results)


if __name__ == "__main__":
    main()
