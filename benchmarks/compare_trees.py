"""Before/after: the same measurements on two source trees (e.g. `git worktree add ../before
<commit>`), each in a fresh process, interleaved measurement by measurement and round by round,
so that both sides see the same machine load.

    python -m benchmarks.compare_trees --before ../before --after . [--rounds 3]
                                       [--measure eval_graph,eval_xla,generate,train]

Measurements (bench model, float32, random weights):
  eval_graph, eval_xla: `eval_bench.memory_paths` at T 80 / M 512, batch 8, 4 segments: tokens/s
    of each memory path (layer inputs, key/value memory, ring, ring in variables), without and
    with XLA.
  generate: `generation_bench.measure` at M 128 and 1600, 6 layers, 32 tokens: ms/token.
  train: a tf.function training step (forward, gradient, Adam) on the layer-input memory,
    batch 8 x 128: tokens/s, best of 5 x 3 steps.
Prints every run's line and then a table of each side's median.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MEASUREMENTS = ("eval_graph", "eval_xla", "generate", "train")


def measure(what):
    """One measurement in this process (its tree's tfxl): a dict of figures."""
    from benchmarks import common, eval_bench, generation_bench
    if what.startswith("eval"):
        rows = eval_bench.memory_paths([(80, 512)], batch=8, segments=4,
                                       jit=what == "eval_xla", reps=3)
        return {k: v for k, v in rows[0].items() if k.endswith("tokens_per_s")}
    if what == "generate":
        gen = generation_bench.measure([128, 1600], n_layer=6, tokens=32, reps=2)
        return {f"M{r['mem_len']}_ms_per_token": r["key_value_ms_per_token"]
                for r in gen["results"]}
    tf = common.setup()
    import keras
    from tfxl.models import TransfoXLLM
    keras.utils.set_random_seed(0)
    model = TransfoXLLM(common.bench_config())
    model.build((None, None))
    optimizer = keras.optimizers.Adam(1e-4)
    optimizer.build(model.trainable_variables)
    batch, length = 8, 128
    ids = tf.random.Generator.from_seed(1).uniform((batch, length + 1), 0,
                                                   model.config.vocab_size, tf.int32)

    @tf.function(jit_compile=False)
    def train_step(ids, memory):
        with tf.GradientTape() as tape:
            nll, new = model(ids[:, :-1], memory, targets=ids[:, 1:], training=True)
            loss = tf.reduce_mean(nll)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss, new
    memory = model.init_memory(batch)
    for _ in range(2):
        _, memory = train_step(ids, memory)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(3):
            loss, memory = train_step(ids, memory)
        float(loss)
        best = min(best, (time.perf_counter() - start) / 3)
    return {"tokens_per_s": batch * length / best}


def run_in(tree, what):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": os.path.abspath(tree)}
    done = subprocess.run([sys.executable, "-m", "benchmarks.compare_trees", "--one", what],
                          cwd=tree, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"{tree}: {what} failed:\n{done.stderr[-2000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before")
    parser.add_argument("--after", default=".")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--measure", default=",".join(MEASUREMENTS))
    parser.add_argument("--one", choices=MEASUREMENTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print("RESULT " + json.dumps(measure(args.one)), flush=True)
        return
    if not args.before:
        parser.error("--before is required")
    runs = {}
    for round_ in range(1, args.rounds + 1):
        for what in args.measure.split(","):
            for side, tree in (("before", args.before), ("after", args.after)):
                result = run_in(tree, what)
                print(side, round_, what, json.dumps(result), flush=True)
                for key, value in result.items():
                    runs.setdefault((what, key), {}).setdefault(side, []).append(value)
    print("\n| measurement | before (median) | after (median) | after / before |")
    print("|---|---:|---:|---:|")
    for (what, key), sides in runs.items():
        before, after = statistics.median(sides["before"]), statistics.median(sides["after"])
        print(f"| {what} {key} | {before:,.1f} | {after:,.1f} | {after / before:.2f} |")


if __name__ == "__main__":
    main()
