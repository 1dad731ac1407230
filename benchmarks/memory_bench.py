"""Benchmark: peak RSS of training steps against an analytic estimate, as mem_len grows.

Every mem_len runs in a fresh subprocess, so its `ru_maxrss` is its own. The child imports
TensorFlow, runs one tiny op and records that RSS as the process baseline; then it builds the
trainer's `Trainer` (model, Adam, per-replica memory) for the `bench` config (float32, global batch
16, T 128) with the given mem_len and runs `--steps` `strategy.run(Trainer.train_step)` steps on
random ids inside a tf.function, as `Runner` does. Peak RSS is compared with

  baseline + weights (4P) + gradients (4P) + Adam slots (8P)
           + memory: the variable and the new memory (2 x 4 B L M D)
           + activations kept for the backward pass (see `activation_bytes`).

    python -m benchmarks.memory_bench [--mem_lens 128,256,512,1024] [--jit off] [--steps 3]
"""

import argparse
import json
import os
import subprocess
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common

BATCH = 16


def activation_bytes(c, batch, mem_len, bytes_per=4):
    """Tensors the backward pass keeps, per layer, summed over layers (fp32).

    Attention: the key/value input [B, K, D], k and v [B, K, NH], q + u and q + v [B, T, NH],
    the position projection [K, NH], the softmax output [B, N, T, K] and, at the peak of the
    backward pass, two more [B, N, T, K] (gradient of the probabilities and of the scores), the
    context and output [B, T, NH]/[B, T, D], a dropout mask and LayerNorm input [B, T, D] each.
    Feed-forward: input [B, T, D], ReLU output and dropout mask [B, T, F] x 2, output and dropout
    mask and LayerNorm input [B, T, D] x 3. Softmax: logits, log-probs and their gradient
    [B, T, V] x 3.
    """
    b, t, k = batch, c.tgt_len, mem_len + c.tgt_len
    d, nh, f, n = c.d_model, c.n_head * c.d_head, c.d_inner, c.n_head
    attention = b * k * d + 2 * b * k * nh + 2 * b * t * nh + k * nh + 3 * b * n * t * k \
        + b * t * nh + 3 * b * t * d
    ffn = b * t * d + 2 * b * t * f + 3 * b * t * d
    softmax = 3 * b * t * c.vocab_size
    return bytes_per * (c.n_layer * (attention + ffn) + softmax)


def estimate(c, batch, mem_len, n_params):
    weights_and_optimizer = 16 * n_params
    memory = 2 * 4 * batch * c.n_layer * mem_len * c.d_model
    activations = activation_bytes(c, batch, mem_len)
    return {"weights_optimizer": weights_and_optimizer, "memory": memory,
            "activations": activations,
            "total": weights_and_optimizer + memory + activations}


def child(mem_len, jit, steps):
    tf = common.setup()
    tf.constant(1.0).numpy()
    baseline = common.peak_rss_mib()
    import keras
    from tfxl.train.loop import build_model
    from tfxl.train.optimization import OptimizerParams
    from tfxl.train.trainer import Trainer

    keras.config.set_dtype_policy("float32")
    config = common.bench_config(mem_len=mem_len)
    strategy = tf.distribute.get_strategy()
    model = build_model(config, strategy)
    trainer = Trainer(model, strategy, None, BATCH, OptimizerParams(), "float32", jit)
    n_params = sum(int(v.numpy().size) for v in model.trainable_variables)
    built = common.peak_rss_mib()
    ids = tf.random.uniform((BATCH, config.tgt_len), 0, config.vocab_size, tf.int32)
    features = {"inputs": ids, "targets": ids, "target_mask": tf.ones_like(ids),
                "reset": tf.zeros((BATCH,), tf.int32)}

    @tf.function
    def step():
        return strategy.run(trainer.train_step, args=(features,))

    for _ in range(steps):
        loss, _ = step()
        loss.numpy()
    peak = common.peak_rss_mib()
    est = estimate(config, BATCH, mem_len, n_params)
    return {"mem_len": mem_len, "jit": jit, "baseline_mib": baseline, "built_mib": built,
            "peak_mib": peak, "n_params": n_params,
            **{f"est_{k}_mib": v / 2**20 for k, v in est.items()},
            "estimate_mib": baseline + est["total"] / 2**20,
            "ratio": peak / (baseline + est["total"] / 2**20)}


def run_child(mem_len, jit, steps):
    cmd = [sys.executable, "-m", "benchmarks.memory_bench", "--child", f"--mem_lens={mem_len}",
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
    rows = ["| mem_len | baseline RSS (MiB) | peak RSS (MiB) | estimate (MiB): baseline + "
            "weights/Adam + memory + activations | peak / estimate | target ≤ 1.3 |",
            "| ---: | ---: | ---: | --- | ---: | --- |"]
    for r in results:
        rows.append(
            f"| {r['mem_len']} | {r['baseline_mib']:.0f} | {r['peak_mib']:.0f} | "
            f"{r['estimate_mib']:.0f} = {r['baseline_mib']:.0f} + "
            f"{r['est_weights_optimizer_mib']:.0f} + {r['est_memory_mib']:.0f} + "
            f"{r['est_activations_mib']:.0f} | {r['ratio']:.2f} | "
            f"{'met' if r['ratio'] <= 1.3 else 'missed'} |")
    if len(results) >= 3:
        xs = [r["mem_len"] for r in results]
        slope, _, r2 = linear_fit(xs, [r["peak_mib"] for r in results])
        est_slope, _, _ = linear_fit(xs, [r["estimate_mib"] for r in results])
        rows.append("")
        rows.append(f"Linear fit of peak RSS against mem_len: {slope:.3f} MiB per memory slot "
                    f"(estimate {est_slope:.3f}), R² = {r2:.4f}.")
    return "\n".join(rows)


def main(argv=None):
    parser = common.add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--mem_lens", default="128,256,512,1024")
    parser.add_argument("--jit", default="off")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    common._THREADS.update(intra_op=args.intra_op, inter_op=args.inter_op)
    mem_lens = [int(m) for m in args.mem_lens.split(",")]
    jit = args.jit == "on"
    if args.child:
        common.setup(args)
        print("RESULT " + json.dumps(child(mem_lens[0], jit, args.steps)))
        return None
    results = []
    for m in mem_lens:
        r = run_child(m, jit, args.steps)
        print(f"mem_len {m}: peak {r['peak_mib']:.0f} MiB, estimate {r['estimate_mib']:.0f} MiB "
              f"(ratio {r['ratio']:.2f})", flush=True)
        results.append(r)
    print(table(results))
    common.dump_json(args.json, results)
    return results


if __name__ == "__main__":
    main()
