"""Benchmark: training tokens/s and model FLOP/s through the real trainer.

Prepares a generated corpus with `tfxl-prepare` (bytes tokenizer) in a temp dir, builds a
`tfxl.train.loop.run.TrainingRun` of a `LanguageModelTask` (default strategy, Adam, clip 0.25) and
runs its own host loop (`TrainStep._loop`: `steps_per_loop` calls of
`strategy.run(TrainStep.replica_step, ...)` inside one tf.function, exactly what
`TrainingRun.train` runs). The first loop (trace + compile) is not timed; then `--loops` loops
of `--steps` steps are timed and the best is reported. FLOP/s use the analytic count of
`benchmarks.common.train_flops` and are compared with the peak of a large `tf.matmul` measured
in the same process.

    python -m benchmarks.train_bench [--configs bench,tiny] [--dtypes float32,mixed_bfloat16]
                                     [--jit on,off] [--steps 8] [--quick]

Each combination runs in a fresh subprocess (dtype policies and XLA caches are process-wide).
"""

import argparse
import json
import os
import subprocess
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common, peer_bench

GLOBAL_BATCH = 16


def run_one(config_name, dtype, jit, steps, loops, data_root, profile_dir=None):
    """In this process: tokens/s of the trainer on one config/dtype/jit combination."""
    tf = common.setup()
    from tfxl.train.tasks.language_model import LanguageModelTask
    from tfxl.train.loop.optimization import OptimizerParams
    from tfxl.train.backends import configure_process
    from tfxl.train.loop.run import RunOptions, TrainingRun

    config = common.CONFIGS[config_name]()
    data_dir = common.prepare_data(data_root, config.tgt_len)
    model_dir = os.path.join(data_root, f"model_{config_name}_{dtype}_{jit}_{os.getpid()}")
    configure_process(mixed_precision=dtype, seed=0)
    runner = TrainingRun(LanguageModelTask(config, data_dir=data_dir),
                         strategy=tf.distribute.get_strategy(),
                         options=RunOptions(
                             model_dir=model_dir, global_batch=GLOBAL_BATCH,
                             optimizer=OptimizerParams(train_steps=10**6, learning_rate=2.5e-4),
                             mixed_precision=dtype, jit_compile=jit, steps_per_loop=steps))
    runner.restore()
    runner.train_step.train_loop_begin()  # the input at the restored step
    loop, iterator = runner.train_step._loop, runner.train_step._iterator
    start = time.perf_counter()
    losses, _ = loop(iterator, tf.constant(steps))
    losses.numpy()
    first = time.perf_counter() - start
    best = best_cpu = float("inf")
    snap = common.cpu_snapshot()
    for _ in range(loops):
        start, cpu_start = time.perf_counter(), time.process_time()
        losses, _ = loop(iterator, tf.constant(steps))
        losses = losses.numpy()
        best = min(best, time.perf_counter() - start)
        best_cpu = min(best_cpu, time.process_time() - cpu_start)
    foreign = common.foreign_cpu_share(snap, common.cpu_snapshot())
    if profile_dir:
        tf.profiler.experimental.start(profile_dir)
        loop(iterator, tf.constant(steps))[0].numpy()
        tf.profiler.experimental.stop()
    tokens = steps * GLOBAL_BATCH * config.tgt_len
    flops = steps * common.train_flops(config, GLOBAL_BATCH)
    peak = common.matmul_peak("float32")
    return {
        "config": config_name, "dtype": dtype, "jit": jit, "batch": GLOBAL_BATCH,
        "tgt_len": config.tgt_len, "mem_len": config.mem_len, "steps_per_loop": steps,
        "first_loop_s": first, "step_s": best / steps, "cpu_s_per_step": best_cpu / steps,
        "tokens_per_s": tokens / best,
        "model_flops_per_s": flops / best, "fp32_matmul_peak": peak,
        "fraction_of_fp32_peak": flops / best / peak, "final_loss": float(losses[-1]),
        "peak_rss_mib": common.peak_rss_mib(), "foreign_cpu": foreign,
    }


def run_subprocess(config_name, dtype, jit, steps, loops, data_root, extra=()):
    cmd = [sys.executable, "-m", "benchmarks.train_bench", "--one",
           f"--configs={config_name}", f"--dtypes={dtype}", f"--jit={'on' if jit else 'off'}",
           f"--steps={steps}", f"--loops={loops}", f"--data_root={data_root}",
           *common.thread_args(), *extra]
    proc = subprocess.run(cmd, cwd=common.REPO, capture_output=True, text=True,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"train_bench child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def table(results, peer=None):
    """`peer`: `peer_bench.measure()` of the same run, for the bench rows' "vs peer" column."""
    theirs = peer["train"] if peer else None
    rows = ["| config | dtype | XLA | step (s) | tokens/s | vs PyTorch peer | model TFLOP/s | "
            "% of fp32 matmul peak (peak TFLOP/s) | first loop (s) | other tenants' CPU |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        rows.append(
            f"| {r['config']} | {r['dtype']} | {'on' if r['jit'] else 'off'} | {r['step_s']:.3f} | "
            f"{r['tokens_per_s']:,.0f} | "
            f"{peer_bench.ratio(r['tokens_per_s'], theirs if r['config'] == 'bench' else None)} | "
            f"{r['model_flops_per_s'] / 1e12:.3f} | "
            f"{100 * r['fraction_of_fp32_peak']:.1f}% ({r['fp32_matmul_peak'] / 1e12:.3f}) | "
            f"{r['first_loop_s']:.1f} | {100 * r.get('foreign_cpu', 0):.0f}% |")
    return "\n".join(rows)


def main(argv=None):
    parser = common.add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--configs", default="bench,tiny")
    parser.add_argument("--dtypes", default="float32,mixed_bfloat16")
    parser.add_argument("--jit", default="on,off")
    parser.add_argument("--steps", type=int, default=None, help="steps per timed loop")
    parser.add_argument("--loops", type=int, default=2, help="timed loops (best is reported)")
    parser.add_argument("--data_root", default=None)
    parser.add_argument("--profile_dir", default=None)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    common._THREADS.update(intra_op=args.intra_op, inter_op=args.inter_op)
    configs = args.configs.split(",")
    dtypes = args.dtypes.split(",")
    jits = [j == "on" for j in args.jit.split(",")]
    if args.one:
        common.setup(args)
        steps = args.steps or 8
        with common.temp_dir() as tmp:
            result = run_one(configs[0], dtypes[0], jits[0], steps, args.loops,
                             args.data_root or tmp, args.profile_dir)
        print("RESULT " + json.dumps(result))
        return result
    results = []
    with common.temp_dir() as tmp:
        data_root = args.data_root or tmp
        for name in configs:
            steps = args.steps or {"bench": 4 if args.quick else 8, "tiny": 50}.get(name, 8)
            for dtype in dtypes:
                for jit in jits:
                    r = run_subprocess(name, dtype, jit, steps, args.loops, data_root)
                    print(f"{name} {dtype} jit={jit}: {r['tokens_per_s']:,.0f} tokens/s, "
                          f"{100 * r['fraction_of_fp32_peak']:.1f}% of fp32 peak", flush=True)
                    results.append(r)
    print(table(results))
    common.dump_json(args.json, results)
    return results


if __name__ == "__main__":
    main()
