"""Benchmark: generation ms/token at batch 1, layer-input memory (the old path) vs key/value memory.

The model is wt103_large-shaped (18 layers, D 1024, 16x64 heads, d_inner 4096) with a small plain
softmax (bytes vocabulary) so it fits, random weights. The memory is full (M valid slots) before
generation starts. Per-token time = (time of a 1 + n token call - time of a 1-token call) / n, both
one in-graph `tf.while_loop` (`tfxl.models.generation.generate` and, for the old path, the same
loop on layer-input memory), so the prompt step and the call overhead cancel out.

The floor at batch 1: every token reads every weight once, so ms/token >= weight bytes / memory
bandwidth; the bandwidth is measured here as the best time of a large array copy (read + write).

    python -m benchmarks.generation_bench [--mem_lens 128,512,1600] [--layers 18] [--tokens 64]
"""

import argparse
import os
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common


def large_config(n_layer=18):
    from tfxl.config import TransfoXLConfig
    return TransfoXLConfig(vocab_size=common.BYTES_VOCAB, n_layer=n_layer, d_model=1024,
                           n_head=16, d_head=64, d_inner=4096, dropout=0.0, tgt_len=128,
                           mem_len=128, clamp_len=1000, same_length=True)


def layer_input_generate(model, prompt_ids, memory, max_new_tokens, **run):
    """The loop before the key/value memory: every token re-projects the M memory rows and the
    K + 1 position encodings in every layer (greedy; sampling costs the same on both paths)."""
    import tensorflow as tf
    log_probs, memory = model(prompt_ids, memory, **run)

    def body(step, last, memory):
        token = tf.argmax(last, axis=-1, output_type=tf.int32)
        log_probs, memory = model(token[:, None], memory, **run)
        return step + 1, log_probs[:, 0], memory

    _, last, memory = tf.while_loop(lambda step, *_: step < max_new_tokens - 1, body,
                                    (tf.constant(0), log_probs[:, -1], memory))
    return tf.argmax(last, axis=-1, output_type=tf.int32), memory


def memory_bandwidth(megabytes=512, seconds=2.0):
    """Best read+write bandwidth of copying a large float32 array (bytes/s)."""
    import numpy as np
    src = np.ones(megabytes * 2**20 // 4, np.float32)
    dst = np.empty_like(src)
    best, end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes / best


def weight_bytes(model):
    return sum(int(v.numpy().nbytes) for v in model.weights)


def measure(mem_lens, n_layer=18, tokens=64, reps=3):
    tf = common.setup()
    import keras
    from tfxl.layers.memory import LayerInputMemory
    from tfxl.models import TransfoXLLM
    from tfxl.models.generation import generate

    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(0)
    config = large_config(n_layer)
    model = TransfoXLLM(config)
    model.build((None, None))
    run = dict(clamp_len=config.clamp_len, same_length=config.same_length)
    bandwidth = memory_bandwidth()
    floor_ms = 1e3 * weight_bytes(model) / bandwidth
    prompt = tf.constant([[7]], tf.int32)
    results = []
    for mem_len in mem_lens:
        rng = tf.random.Generator.from_seed(mem_len)
        states = LayerInputMemory(rng.normal((1, config.n_layer, mem_len, config.d_model)),
                                  tf.ones((1, mem_len), tf.bool))
        key_value = model.key_value_memory(states)
        paths = {
            "layer_input": tf.function(lambda n: layer_input_generate(
                model, prompt, states, n, **run)[0]),
            "key_value": tf.function(lambda n: generate(
                model, prompt, key_value, n, temperature=0.0, **run)[0]),
        }
        row = {"mem_len": mem_len, "n_layer": n_layer}
        for _ in range(reps):  # interleaved: both paths see the same machine load
            for name, fn in paths.items():
                for n in (1, 1 + tokens):
                    fn(tf.constant(n)).numpy()  # trace once per path; n is a tensor
                    start = time.perf_counter()
                    fn(tf.constant(n)).numpy()
                    key = f"{name}_{n}"
                    row[key] = min(row.get(key, float("inf")), time.perf_counter() - start)
        for name in paths:
            row[f"{name}_ms_per_token"] = 1e3 * (row[f"{name}_{1 + tokens}"]
                                                 - row[f"{name}_1"]) / tokens
        row["floor_ms_per_token"] = floor_ms
        results.append(row)
        print(f"M={mem_len}: layer-input {row['layer_input_ms_per_token']:.1f} ms/token, "
              f"key/value {row['key_value_ms_per_token']:.1f} ms/token (weight-read floor "
              f"{floor_ms:.1f} ms at {bandwidth / 1e9:.1f} GB/s)", flush=True)
    return {"results": results, "bandwidth_bytes_per_s": bandwidth,
            "weight_bytes": weight_bytes(model)}


def table(out):
    results = out["results"]
    rows = ["| M | layer-input memory (ms/token) | key/value memory (ms/token) | speed-up | "
            "weight-read floor (ms/token) |", "| ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        old, new = r["layer_input_ms_per_token"], r["key_value_ms_per_token"]
        rows.append(f"| {r['mem_len']} | {old:.1f} | {new:.1f} | {old / new:.2f}× | "
                    f"{r['floor_ms_per_token']:.1f} |")
    first, last = results[0], results[-1]
    rows.append("")
    rows.append(f"Weights {out['weight_bytes'] / 2**20:.0f} MiB, copy bandwidth "
                f"{out['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s. Key/value path at M = "
                f"{last['mem_len']} vs M = {first['mem_len']}: "
                f"{last['key_value_ms_per_token'] / first['key_value_ms_per_token']:.2f}× "
                f"(target ≤ 1.5×); vs the layer-input path at M = {last['mem_len']}: "
                f"{last['layer_input_ms_per_token'] / last['key_value_ms_per_token']:.2f}× "
                "fewer ms/token (target ≥ 3×).")
    return "\n".join(rows)


def main(argv=None):
    parser = common.add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--mem_lens", default="128,512,1600")
    parser.add_argument("--layers", type=int, default=18)
    parser.add_argument("--tokens", type=int, default=64,
                        help="new tokens timed (the window merges every 32)")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    common.setup(args)
    out = measure([int(m) for m in args.mem_lens.split(",")], args.layers,
                  4 if args.quick else args.tokens, 1 if args.quick else args.reps)
    print(table(out))
    common.dump_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
