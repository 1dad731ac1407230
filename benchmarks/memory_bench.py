"""Benchmark: peak RSS of training steps against the analytic estimate of `tfxl-train`'s plan.

Every row runs in a fresh subprocess, so its `ru_maxrss` is its own. The child imports
TensorFlow, runs one tiny op and records that RSS as the process baseline; then it builds the
train step's `TrainStep` (model, Adam, per-replica memory) for the row's config, dtype policy, batch
and mem_len, and runs `--steps` `strategy.run(TrainStep.replica_step)` steps on random ids inside a
tf.function, as tfxl-train's `TrainingRun` does. Peak RSS is compared with

  baseline + tfxl.train.footprint.training_footprint(...).total

(weights, gradients, optimizer slots, the memory state, the activations kept for the backward
pass and, with --jit on, XLA's share: the items `tfxl-train` prints before its first step; the
formulas live in that module).

    python -m benchmarks.memory_bench [--configs bench] [--dtypes float32] [--batch 16] \
        [--mem_lens 128,256,512,1024] [--jit off] [--steps 3]

`--configs` takes `bench`, `tiny` (benchmarks/common.py) or a tfxl preset name (bytes vocabulary).
"""

import argparse
import itertools
import json
import os
import subprocess
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common

BATCH = 16


def config_for(name, mem_len):
    if name in common.CONFIGS:
        return common.CONFIGS[name](mem_len=mem_len)
    from tfxl.config import get_preset
    return get_preset(name, vocab_size=common.BYTES_VOCAB, mem_len=mem_len)


def child(name, dtype, batch, mem_len, jit, steps):
    tf = common.setup()
    tf.constant(1.0).numpy()
    baseline = common.peak_rss_mib()
    import keras
    from tfxl.train.footprint import training_footprint
    from tfxl.train.language_model import LanguageModelTask, build_model
    from tfxl.train.optimization import OptimizerParams
    from tfxl.train.train_step import TrainStep

    keras.config.set_dtype_policy(dtype)
    config = config_for(name, mem_len)
    strategy = tf.distribute.get_strategy()
    model = build_model(config, strategy)
    trainer = TrainStep(LanguageModelTask(config, data_dir=None), model, strategy=strategy,
                        data=None, global_batch=batch, optimizer=OptimizerParams(),
                        mixed_precision=dtype, jit_compile=jit)
    n_params = sum(int(v.numpy().size) for v in model.trainable_variables)
    built = common.peak_rss_mib()
    ids = tf.random.uniform((batch, config.tgt_len), 0, config.vocab_size, tf.int32)
    features = {"inputs": ids, "targets": ids, "target_mask": tf.ones_like(ids),
                "reset": tf.zeros((batch,), tf.int32)}

    @tf.function
    def step():
        return strategy.run(trainer.replica_step, args=(features,))

    for _ in range(steps):
        loss, _ = step()
        loss.numpy()
    peak = common.peak_rss_mib()
    est = training_footprint(config, batch, dtype, "adam", jit_compile=jit)
    items = {"weights_optimizer": est.weights + est.gradients + est.optimizer,
             "memory": est.memory_state, "activations": sum(est.activations.values()),
             "xla": est.xla, "total": est.total}
    return {"config": name, "dtype": dtype, "batch": batch, "mem_len": mem_len,
            "tgt_len": config.tgt_len, "jit": jit, "baseline_mib": baseline, "built_mib": built,
            "peak_mib": peak, "n_params": n_params, "est_parameters": est.parameters,
            **{f"est_{k}_mib": v / 2**20 for k, v in items.items()},
            "estimate_mib": baseline + est.total / 2**20,
            "ratio": peak / (baseline + est.total / 2**20),
            "step_ratio": (peak - baseline) / (est.total / 2**20)}


def run_child(name, dtype, batch, mem_len, jit, steps):
    cmd = [sys.executable, "-m", "benchmarks.memory_bench", "--child", f"--configs={name}",
           f"--dtypes={dtype}", f"--batch={batch}", f"--mem_lens={mem_len}",
           f"--jit={'on' if jit else 'off'}", f"--steps={steps}", *common.thread_args()]
    proc = subprocess.run(cmd, cwd=common.REPO, capture_output=True, text=True,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"memory_bench child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def linear_fit(xs, ys):
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    intercept = my - slope * mx
    ss_tot = sum((y - my) ** 2 for y in ys) or 1e-12
    ss_res = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys))
    return slope, intercept, 1 - ss_res / ss_tot


def table(results):
    rows = ["| config | dtype | XLA | batch | T / M | baseline RSS (MiB) | peak RSS (MiB) | "
            "estimate (MiB): baseline + weights/grads/Adam + memory + activations (+ XLA) | "
            "peak / estimate | target ≤ 1.3 |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | --- | ---: | --- |"]
    for r in results:
        rows.append(
            f"| {r.get('config', 'bench')} | {r.get('dtype', 'float32')} | "
            f"{'on' if r['jit'] else 'off'} | {r.get('batch', BATCH)} | "
            f"{r.get('tgt_len', 128)} / {r['mem_len']} | {r['baseline_mib']:.0f} | "
            f"{r['peak_mib']:.0f} | "
            f"{r['estimate_mib']:.0f} = {r['baseline_mib']:.0f} + "
            f"{r['est_weights_optimizer_mib']:.0f} + {r['est_memory_mib']:.0f} + "
            f"{r['est_activations_mib']:.0f}"
            f"{' + %.0f' % r['est_xla_mib'] if r.get('est_xla_mib') else ''} | {r['ratio']:.2f} | "
            f"{'met' if r['ratio'] <= 1.3 else 'missed'} |")
    sweep = [r for r in results if (r.get("config"), r.get("dtype"), r.get("batch"), r["jit"])
             == (results[0].get("config"), results[0].get("dtype"), results[0].get("batch"),
                 results[0]["jit"])]
    if len({r["mem_len"] for r in sweep}) >= 3:
        xs = [r["mem_len"] for r in sweep]
        slope, _, r2 = linear_fit(xs, [r["peak_mib"] for r in sweep])
        est_slope, _, _ = linear_fit(xs, [r["estimate_mib"] for r in sweep])
        rows.append("")
        rows.append(f"Linear fit of peak RSS against mem_len ({sweep[0].get('config', 'bench')}): "
                    f"{slope:.3f} MiB per memory slot (estimate {est_slope:.3f}), R² = {r2:.4f}.")
    return "\n".join(rows)


def main(argv=None):
    parser = common.add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--configs", default="bench")
    parser.add_argument("--dtypes", default="float32")
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--mem_lens", default="128,256,512,1024")
    parser.add_argument("--jit", default="off")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    common._THREADS.update(intra_op=args.intra_op, inter_op=args.inter_op)
    configs, dtypes = args.configs.split(","), args.dtypes.split(",")
    mem_lens = [int(m) for m in args.mem_lens.split(",")]
    jits = [j == "on" for j in args.jit.split(",")]
    if args.child:
        common.setup(args)
        print("RESULT " + json.dumps(child(configs[0], dtypes[0], args.batch, mem_lens[0],
                                           jits[0], args.steps)))
        return None
    results = []
    for name, dtype, jit, m in itertools.product(configs, dtypes, jits, mem_lens):
        r = run_child(name, dtype, args.batch, m, jit, args.steps)
        print(f"{name} {dtype} XLA {'on' if jit else 'off'} batch {args.batch} mem_len {m}: "
              f"peak {r['peak_mib']:.0f} MiB, estimate {r['estimate_mib']:.0f} MiB "
              f"(ratio {r['ratio']:.2f}; step {r['peak_mib'] - r['baseline_mib']:.0f} MiB vs "
              f"{r['estimate_mib'] - r['baseline_mib']:.0f})", flush=True)
        results.append(r)
    print(table(results))
    common.dump_json(args.json, results)
    return results


if __name__ == "__main__":
    main()
