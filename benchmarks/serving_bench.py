"""Benchmark: `score_document` tokens/s through an exported SavedModel, as a server runs it.

The bench model (float32, random weights) is exported with `tfxl-export`'s code at evaluation
settings T and M; then a fresh process that imports only TensorFlow (not tfxl) loads the export
and times the `score_document` signature on [B, S] documents (the whole document in one request,
segments looped in-graph on the key/value memory). The first call is not timed; the best of
`--reps` calls counts. Tokens/s counts the S - 1 scored targets of every row.

    python -m benchmarks.serving_bench [--tgt_len 128] [--mem_len 128] [--batch 16] [--length 2049]
"""

import argparse
import json
import os
import subprocess
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common

# Runs in the child: TensorFlow only.
CLIENT = r"""
import json, sys, time
import tensorflow as tf
path, batch, length, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
score = tf.saved_model.load(path).signatures["score_document"]
ids = tf.random.stateless_uniform([batch, length], [1, 2], 0, 258, tf.int32)
score(token_ids=ids)["mean_nll"].numpy()
best = float("inf")
for _ in range(reps):
    start = time.perf_counter()
    score(token_ids=ids)["mean_nll"].numpy()
    best = min(best, time.perf_counter() - start)
print(json.dumps({"seconds": best,
                  "tfxl_imported": any(m.startswith("tfxl") for m in sys.modules)}))
"""


def measure(tgt_len=128, mem_len=128, batch=16, length=2049, reps=3):
    common.setup()
    import keras
    from tfxl.models import TransfoXLLM
    from tfxl.models.signatures import export_saved_model

    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(0)
    config = common.bench_config(eval_tgt_len=tgt_len, eval_mem_len=mem_len)
    model = TransfoXLLM(config)
    model.build((None, None))
    with common.temp_dir() as tmp:
        path = export_saved_model(model, tmp)
        proc = subprocess.run([sys.executable, "-c", CLIENT, path, str(batch), str(length),
                               str(reps)], capture_output=True, text=True,
                              env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    if proc.returncode:
        raise RuntimeError(f"serving client failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not out["tfxl_imported"]
    tokens = batch * (length - 1)
    result = {"tgt_len": tgt_len, "mem_len": mem_len, "batch": batch, "length": length,
              "seconds": out["seconds"], "tokens_per_s": tokens / out["seconds"]}
    print(f"score_document T={tgt_len} M={mem_len} [{batch}, {length}]: "
          f"{result['tokens_per_s']:,.0f} tokens/s", flush=True)
    return result


def table(results):
    rows = ["| eval segment T | memory M | request [B, S] | seconds per request | tokens/s |",
            "| ---: | ---: | --- | ---: | ---: |"]
    for r in results:
        rows.append(f"| {r['tgt_len']} | {r['mem_len']} | [{r['batch']}, {r['length']}] | "
                    f"{r['seconds']:.2f} | {r['tokens_per_s']:,.0f} |")
    return "\n".join(rows)


def main(argv=None):
    parser = common.add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--settings", default="128:128,80:512",
                        help="comma-separated T:M evaluation settings of the export")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=2049)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    common.setup(args)
    results = [measure(int(t), int(m), args.batch, 513 if args.quick else args.length,
                       1 if args.quick else args.reps)
               for t, m in (s.split(":") for s in args.settings.split(","))]
    print(table(results))
    common.dump_json(args.json, results)
    return results


if __name__ == "__main__":
    main()
