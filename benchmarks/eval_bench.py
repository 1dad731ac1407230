"""Benchmark: evaluation with memory, and cached evaluation against vanilla recompute.

Part A, `cached` (the paper's Table 9 protocol, scaled down to the `bench` model):
  the same weights score one long text (batch 1) in two ways, at attention length L:
  * Transformer-XL: segments of T tokens (default 128, the paper's eval_tgt_len for enwik8-large)
    on a key/value memory of M = L slots with the position keys computed once, and
    same_length=True, so every query attends to exactly L previous positions plus itself.
    Per-token time = time of one segment step / T.
  * vanilla: mem_len 0 and a sliding window of L + 1 tokens (L previous positions plus the token)
    recomputed from scratch for every scored token (one full forward of length L + 1 per token;
    only its last position is used). Per-token time = time of one forward.
  Both run the model's call in a `tf.function` (jit_compile as given), in float32, with random
  weights (speed does not depend on them); the best of `--reps` calls after a warm-up is used.
  Speed-up = vanilla / XL per-token time; the paper reports speed-up / L ~ 0.45-0.50.

Part `paths`: the same model on both memories, segment after segment (`memory_paths`).

Part B, `throughput`: evaluation tokens/s through the real trainer (`TrainingRun.evaluate`: the
per-replica `Evaluator.eval_step` on the key/value memory in `steps_per_loop` host loops, data from
`tfxl-prepare` rechunked to the eval segment length), global batch 16, at the training setting
(T = M = 128), at T 80 / M 512 and at the paper's enwik8 evaluation shape T 80 / M 2100. The first
call compiles and is not timed.

    python -m benchmarks.eval_bench [--part cached,paths,throughput] [--lengths 128,256,512,1024]
                                    [--jit on] [--quick]
"""

import argparse
import os
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common, peer_bench


def _best_time(fn, reps, min_seconds=2.0):
    fn()  # compile / warm up
    best, calls, start_all = float("inf"), 0, time.perf_counter()
    while calls < reps or time.perf_counter() - start_all < min_seconds:
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
        calls += 1
        if calls >= 50:
            break
    return best


def _bench_model():
    """The bench model in float32 with seeded random weights (speed does not depend on them)."""
    import keras
    from tfxl.models import TransfoXLLM

    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(0)
    model = TransfoXLLM(common.bench_config())
    model.build((None, None))
    return model


def cached_vs_vanilla(lengths, seg_len=128, batch=1, jit=True, reps=3):
    tf = common.setup()
    model = _bench_model()
    config = model.config

    def forward(ids, memory, targets, same_length, position_keys=None):
        nll, new_memory = model(ids, memory, targets=targets, training=False,
                                same_length=same_length, position_keys=position_keys)
        return tf.reduce_sum(nll), new_memory

    forward = tf.function(forward, jit_compile=jit, reduce_retracing=False,
                          autograph=False)
    rng = tf.random.Generator.from_seed(0)
    results = []
    for length in lengths:
        # Transformer-XL: segment of T with a full key/value memory of M = L slots, position
        # keys computed once (as every evaluation pass does).
        ids = rng.uniform((batch, seg_len), 0, config.vocab_size, tf.int32)
        memory = model.init_memory(batch, mem_len=length)
        memory = model.key_value_memory(memory._replace(
            states=rng.normal(memory.states.shape) * 0.5, valid=tf.ones_like(memory.valid)))
        position_keys = model.position_keys(length + seg_len)

        def xl_step():
            loss, new = forward(ids, memory, ids, True, position_keys)
            loss.numpy()

        xl = _best_time(xl_step, reps) / seg_len
        # Vanilla: one forward over a window of L + 1 tokens per scored token.
        window = rng.uniform((batch, length + 1), 0, config.vocab_size, tf.int32)
        empty = model.init_memory(batch, mem_len=0)

        def vanilla_step():
            loss, _ = forward(window, empty, window, False)
            loss.numpy()

        vanilla = _best_time(vanilla_step, reps)
        flops_xl = common.forward_flops(config, batch, seg_len, length,
                                        key_value_memory=True) / seg_len
        flops_vanilla = common.forward_flops(config, batch, length + 1, 0)
        results.append({
            "attention_length": length, "seg_len": seg_len, "batch": batch, "jit": jit,
            "xl_ms_per_token": 1e3 * xl / batch, "vanilla_ms_per_token": 1e3 * vanilla / batch,
            "speedup": vanilla / xl, "speedup_over_length": vanilla / xl / length,
            "flop_ratio": flops_vanilla / flops_xl,
        })
        print(f"L={length}: XL {1e3 * xl:.3f} ms/token, vanilla {1e3 * vanilla:.1f} ms/token, "
              f"speed-up {vanilla / xl:.0f}x ({vanilla / xl / length:.2f} L; FLOP ratio "
              f"{flops_vanilla / flops_xl:.0f})", flush=True)
    return results


PATHS = {  # name in the results -> what it is
    "layer_input": "layer-input memory",
    "key_value": "key/value memory (appended, last M kept)",
    "ring": "key/value ring (tensors through the step)",
    "ring_in_place": "key/value ring (variables, written in the step)",
}


def memory_paths(settings, batch=16, segments=8, jit=True, reps=3):
    """Evaluation tokens/s of the same model on each memory, segment after segment.

    The bench model (float32, random weights) scores `segments` consecutive [batch, T] segments
    with memory M, carried from one segment to the next, on each of `PATHS`:
      * the layer-input memory: every segment re-projects the M memory rows and the K position
        encodings in every layer (the path before the key/value memory);
      * the key/value memory: T new rows projected, appended, the last M kept (a copy of every
        layer's keys and values per segment);
      * the key/value ring: the T new rows written over the oldest (`KeyValueRing`), the memory
        passed in and out of the compiled step as tensors (how `tfxl-eval`'s Evaluator and
        `score_document` carry it; XLA copies a buffer it was handed before writing into it);
      * the same ring held in variables that the compiled step reads and writes itself, so XLA
        may update them in place (how a TPU step, compiled whole, carries it).
    Position keys computed once per pass except on the layer-input path. One compiled segment
    step per path (jit_compile as given), the same data, interleaved repetitions; the best pass
    counts.
    """
    tf = common.setup()
    from tfxl.models.memory_variables import MemoryVariables

    model = _bench_model()
    config = model.config

    @tf.function(jit_compile=jit, reduce_retracing=False, autograph=False)
    def step(ids, memory, position_keys):
        nll, new_memory = model(ids[:, :-1], memory, targets=ids[:, 1:], training=False,
                                position_keys=position_keys)
        return tf.reduce_sum(nll), new_memory

    results = []
    for tgt_len, mem_len in settings:
        data = tf.random.Generator.from_seed(tgt_len + mem_len).uniform(
            (segments, batch, tgt_len + 1), 0, config.vocab_size, tf.int32)
        position_keys = model.position_keys(mem_len + tgt_len)

        def tensor_pass(empty, keys):
            def run():
                memory, total = empty(), 0.0
                for ids in data:
                    nll, memory = step(ids, memory, keys)
                    total += nll
                return float(total)
            return run

        held = MemoryVariables(model.init_key_value_ring(batch, tgt_len, mem_len), "ring")

        @tf.function(jit_compile=jit, reduce_retracing=False, autograph=False)
        def in_place_step(ids, keys):
            nll, new_memory = model(ids[:, :-1], held.read(), targets=ids[:, 1:],
                                    training=False, position_keys=keys)
            held.write(new_memory)
            return tf.reduce_sum(nll)

        def in_place_pass():
            held.clear()
            return float(sum(in_place_step(ids, position_keys) for ids in data))

        passes = {
            "layer_input": tensor_pass(lambda: model.init_memory(batch, mem_len=mem_len), None),
            "key_value": tensor_pass(
                lambda: model.init_key_value_memory(batch, mem_len=mem_len), position_keys),
            "ring": tensor_pass(lambda: model.init_key_value_ring(batch, tgt_len, mem_len),
                                position_keys),
            "ring_in_place": in_place_pass,
        }
        sums = {name: fn() for name, fn in passes.items()}  # trace + compile
        best = {name: float("inf") for name in passes}
        for _ in range(reps):  # interleaved: every path sees the same machine load
            for name, fn in passes.items():
                start = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - start)
        tokens = segments * batch * tgt_len
        row = {"tgt_len": tgt_len, "mem_len": mem_len, "batch": batch, "jit": jit,
               "same_nll": all(abs(v - sums["layer_input"]) <= 1e-4 * abs(sums["layer_input"])
                               for v in sums.values())}
        for name in passes:
            row[f"{name}_tokens_per_s"] = tokens / best[name]
        fastest = max(("key_value", "ring", "ring_in_place"),
                      key=lambda name: row[f"{name}_tokens_per_s"])
        row["speedup"] = row[f"{fastest}_tokens_per_s"] / row["layer_input_tokens_per_s"]
        row["fastest"] = fastest
        results.append(row)
        print(f"eval T={tgt_len} M={mem_len} jit={jit}: " + ", ".join(
            f"{name} {row[f'{name}_tokens_per_s']:,.0f} tokens/s" for name in passes)
            + f" (best/layer-input {row['speedup']:.2f}x)", flush=True)
    return results


def trainer_throughput(settings, jit=True, dtype="float32", batches=20, data_root=None):
    tf = common.setup()
    from tfxl.train.tasks.language_model import LanguageModelTask
    from tfxl.train.loop.optimization import OptimizerParams
    from tfxl.train.loop.run import RunOptions, TrainingRun
    from tfxl.train.backends import configure_process

    config = common.bench_config()
    results = []
    with common.temp_dir() as tmp:
        root = data_root or tmp
        data_dir = common.prepare_data(root, config.tgt_len)
        configure_process(mixed_precision=dtype, seed=0)
        runner = TrainingRun(
            LanguageModelTask(config, data_dir=data_dir), strategy=tf.distribute.get_strategy(),
            options=RunOptions(model_dir=os.path.join(root, f"eval_model_{os.getpid()}"),
                               global_batch=16, optimizer=OptimizerParams(),
                               mixed_precision=dtype, jit_compile=jit, steps_per_loop=batches))
        for tgt_len, mem_len in settings:
            kwargs = dict(batch_size=16, tgt_len=tgt_len, mem_len=mem_len, max_batches=batches)
            runner.evaluate("valid", **kwargs)  # trace + compile
            best = float("inf")
            for _ in range(2):
                start = time.perf_counter()
                out = runner.evaluate("valid", **kwargs)
                best = min(best, time.perf_counter() - start)
            tokens = out["tokens"]
            flops = batches * common.forward_flops(config, 16, tgt_len, mem_len,
                                                   key_value_memory=True)
            results.append({"tgt_len": tgt_len, "mem_len": mem_len, "batch": 16, "jit": jit,
                            "dtype": dtype, "tokens_per_s": tokens / best,
                            "model_flops_per_s": flops / best, "seconds": best,
                            "tokens": tokens})
            print(f"eval T={tgt_len} M={mem_len} {dtype} jit={jit}: {tokens / best:,.0f} tokens/s "
                  f"({flops / best / 1e12:.3f} TFLOP/s)", flush=True)
    return results


def table_cached(results):
    rows = ["| attention length L | XL (T=%d, M=L) ms/token | vanilla (window L+1) ms/token | "
            "speed-up | speed-up / L | target ≥ 0.6 L at 1024 | analytic FLOP ratio |"
            % results[0]["seg_len"],
            "| ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for r in results:
        target = "—"
        if r["attention_length"] >= 1024:
            target = "met" if r["speedup_over_length"] >= 0.6 else (
                f"missed by {100 * (1 - r['speedup_over_length'] / 0.6):.0f}%")
        rows.append(f"| {r['attention_length']} | {r['xl_ms_per_token']:.3f} | "
                    f"{r['vanilla_ms_per_token']:.1f} | {r['speedup']:.0f}× | "
                    f"{r['speedup_over_length']:.2f} | {target} | {r['flop_ratio']:.0f}× |")
    return "\n".join(rows)


PATH_TARGETS = {(80, 512): 2.0, (80, 2100): 3.0}


def table_paths(results):
    rows = ["| eval segment T | memory M | XLA | " + " | ".join(
        f"{label} (tokens/s)" for label in PATHS.values())
        + " | fastest / layer-input | target | same NLL |",
        "| ---: | ---: | --- |" + " ---: |" * len(PATHS) + " ---: | --- | --- |"]
    for r in results:
        target = PATH_TARGETS.get((r["tgt_len"], r["mem_len"]))
        verdict = "—" if target is None else (
            f"≥ {target:g}×: " + ("met" if r["speedup"] >= target else
                                  f"missed by {100 * (1 - r['speedup'] / target):.0f}%"))
        rows.append(f"| {r['tgt_len']} | {r['mem_len']} | {'on' if r['jit'] else 'off'} | "
                    + " | ".join(f"{r[f'{name}_tokens_per_s']:,.0f}" for name in PATHS)
                    + f" | {r['speedup']:.2f}× ({r['fastest']}) | {verdict} | "
                    f"{'yes' if r['same_nll'] else 'NO'} |")
    return "\n".join(rows)


def table_throughput(results, peer=None):
    """`peer`: `peer_bench.measure()` of the same run, for the "vs peer" column (— without it)."""
    rows = ["| eval segment T | memory M | dtype | XLA | tokens/s | model TFLOP/s | "
            "vs PyTorch peer (its tokens/s) |", "| ---: | ---: | --- | --- | ---: | ---: | ---: |"]
    for r in results:
        theirs = peer_bench.eval_row(peer, r["tgt_len"], r["mem_len"])
        rows.append(f"| {r['tgt_len']} | {r['mem_len']} | {r['dtype']} | "
                    f"{'on' if r['jit'] else 'off'} | {r['tokens_per_s']:,.0f} | "
                    f"{r['model_flops_per_s'] / 1e12:.3f} | "
                    f"{peer_bench.ratio(r['tokens_per_s'], theirs)} "
                    f"({common.fmt(theirs and theirs['tokens_per_s'])}) |")
    return "\n".join(rows)


def main(argv=None):
    parser = common.add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--part", default="cached,paths,throughput")
    parser.add_argument("--lengths", default="128,256,512,1024")
    parser.add_argument("--seg_len", type=int, default=128)
    parser.add_argument("--jit", default="on", help="on, off or on,off (throughput runs each; "
                        "the cached comparison uses the first)")
    parser.add_argument("--dtypes", default="float32")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--data_root", default=None)
    args = parser.parse_args(argv)
    common.setup(args)
    jits = [j == "on" for j in args.jit.split(",")]
    jit = jits[0]
    out = {}
    if "cached" in args.part:
        lengths = [int(x) for x in args.lengths.split(",")]
        out["cached"] = cached_vs_vanilla(lengths, args.seg_len, jit=jit, reps=args.reps)
        print(table_cached(out["cached"]))
    if "paths" in args.part:
        out["paths"] = []
        for jit_paths in jits:
            out["paths"] += memory_paths([(128, 128), (80, 512), (80, 2100)],
                                         segments=4 if args.quick else 8, jit=jit_paths,
                                         reps=1 if args.quick else args.reps)
        print(table_paths(out["paths"]))
    if "throughput" in args.part:
        settings = [(128, 128), (80, 512), (80, 2100)]
        out["throughput"] = []
        for dtype in args.dtypes.split(","):
            for jit_throughput in jits:
                out["throughput"] += trainer_throughput(settings, jit=jit_throughput, dtype=dtype,
                                                        batches=8 if args.quick else 20,
                                                        data_root=args.data_root)
        print(table_throughput(out["throughput"]))
    common.dump_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
