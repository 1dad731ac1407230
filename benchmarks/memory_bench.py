"""Benchmark: peak RSS of training steps against the memory estimate of `tfxl-train`'s plan, on
TensorFlow and on JAX.

Every row runs in a fresh subprocess, so its peak RSS (VmHWM) is its own. The child imports
TensorFlow (and JAX, on JAX: tfxl-train's input pipeline is tf.data on both), runs one tiny op
and records that RSS as the process baseline, what the plan measures as the runtime
(`resident_bytes`) before the first step. Then it builds the row's model and optimizer and runs
`--steps` training steps on random ids: TensorFlow's `TrainStep.replica_step` inside a
tf.function (XLA-compiled with --jit on), or JAX's `JaxTrainStep` (one compiled loop). Peak RSS
is compared with the plan's figure for the whole process,

  baseline + tfxl.sizing.training_footprint(...).total

and, on JAX, with the same figure from the compiled loop's `memory_analysis()`
(`Footprint.with_compiled`).

    python -m benchmarks.memory_bench [--configs heavy,wide,deep,bench] [--dtypes float32] \
        [--backends tensorflow,jax] [--batch 4] [--mem_lens 128] [--jit off,on] [--steps 2]

`--configs` takes the shapes of SHAPES, `bench`, `tiny` (benchmarks/common.py) or a tfxl preset
name (bytes vocabulary).
"""

import argparse
import itertools
import json
import os
import subprocess
import sys

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common
from tfxl.sizing import LOWEST_RATIO

BATCH = 16


# Shapes of the grid beyond the presets: "heavy" is ruled by its parameters (weights, gradients,
# the optimizer's slots and temporaries), "wide" by the activations of width D ([B, K, D]
# tensors), "deep" by the many layers' activations and the program's size.
SHAPES = {
    "heavy": dict(n_layer=2, d_model=1024, n_head=4, d_head=64, d_inner=8192, tgt_len=16),
    "wide": dict(n_layer=2, d_model=8192, n_head=2, d_head=32, d_inner=256, tgt_len=64),
    "deep": dict(n_layer=8, d_model=256, n_head=8, d_head=32, d_inner=1024, tgt_len=32),
}


def config_for(name, mem_len):
    if name in common.CONFIGS:
        return common.CONFIGS[name](mem_len=mem_len)
    if name in SHAPES:
        return common.bench_config(**{**SHAPES[name], "mem_len": mem_len})
    from tfxl.config import get_preset
    return get_preset(name, vocab_size=common.BYTES_VOCAB, mem_len=mem_len)


def _baseline(backend):
    """The idle process's peak RSS with the run's libraries imported and one op run: what the
    plan counts as the runtime (`resident_bytes` before the first step)."""
    tf = common.setup()
    tf.constant(1.0).numpy()
    if backend == "jax":
        import jax.numpy as jnp
        jnp.ones(()).block_until_ready()
    import keras  # noqa: F401  (the plan is printed with Keras loaded)
    return common.peak_rss_mib()


def _features(batch, config, np):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, config.vocab_size, (batch, config.tgt_len), dtype=np.int32)
    return {"inputs": ids, "targets": ids, "target_mask": np.ones_like(ids),
            "reset": np.zeros((batch,), np.int32)}


def _tensorflow_steps(config, dtype, batch, jit, steps):
    import numpy as np
    import tensorflow as tf
    from tfxl.train.tasks.language_model import LanguageModelTask, build_model
    from tfxl.train.loop.optimization import OptimizerParams
    from tfxl.train import backends

    strategy = tf.distribute.get_strategy()
    model = build_model(config, strategy)
    trainer = backends.for_strategy(strategy).train_step(
        LanguageModelTask(config, data_dir=None), model, data=None, global_batch=batch,
        optimizer=OptimizerParams(), mixed_precision=dtype, jit_compile=jit)
    features = {k: tf.constant(v) for k, v in _features(batch, config, np).items()}

    @tf.function
    def step():
        return strategy.run(trainer.replica_step, args=(features,))

    for _ in range(steps):
        loss, _ = step()
        loss.numpy()
    return model, None


class _Batches:
    """The train split as JaxTrainStep reads it, the same random batch every step."""

    def __init__(self, config, batch):
        import numpy as np
        self.batch = _features(batch, config, np)

    def dataset(self, split, batch, training, skip_batches=0):
        def batches():
            while True:
                yield self.batch
        return type("Batches", (), {"as_numpy_iterator": staticmethod(batches)})()


def _jax_steps(config, dtype, batch, steps):
    """`steps` steps of JaxTrainStep in one compiled loop, and what XLA says the compiled loop
    uses (`memory_analysis`, compiled again after the peak was read)."""
    from tfxl.tpu.jax_mesh import resolve_distribution
    from tfxl.train import backends
    from tfxl.train.tasks.language_model import LanguageModelTask, build_model
    from tfxl.train.loop.optimization import OptimizerParams

    strategy = resolve_distribution("data_parallel")
    model = build_model(config, strategy)
    data = _Batches(config, batch)
    trainer = backends.for_strategy(strategy).train_step(
        LanguageModelTask(config, data_dir=None), model, data=data, global_batch=batch,
        optimizer=OptimizerParams(), mixed_precision=dtype)
    trainer.train(steps)

    def analysis():
        import numpy as np
        stacked = {k: strategy.global_array(np.stack([v] * steps), batch_axis=1)
                   for k, v in data.batch.items()}
        state = trainer._placed(trainer._state())
        return trainer._loops.lower(state, stacked).compile().memory_analysis()
    return model, analysis


def child(name, dtype, batch, mem_len, jit, steps):
    import keras
    backend = keras.backend.backend()
    baseline = _baseline(backend)
    keras.config.set_dtype_policy(dtype)
    config = config_for(name, mem_len)
    jit = jit or backend == "jax"  # JAX's step is always compiled
    if backend == "jax":
        model, analysis = _jax_steps(config, dtype, batch, steps)
    else:
        model, analysis = _tensorflow_steps(config, dtype, batch, jit, steps)
    peak = common.peak_rss_mib()
    compiled = None
    if analysis is not None:
        from tfxl.sizing import compiled_bytes
        compiled = compiled_bytes(analysis()) / 2**20
    return estimated({
        "config": name, "backend": backend, "dtype": dtype, "batch": batch, "mem_len": mem_len,
        "tgt_len": config.tgt_len, "n_layer": config.n_layer, "d_model": config.d_model,
        "jit": jit, "baseline_mib": baseline, "peak_mib": peak,
        "n_params": sum(int(np.prod(v.shape)) for v in model.trainable_variables),
        "compiled_mib": compiled})


def estimated(row):
    """`row`, a measurement, with the plan's estimate of it (`est_*`, `ratio`): also how
    `--rescore` puts the formulas of this checkout against earlier measurements."""
    from tfxl.sizing import training_footprint
    config = config_for(row["config"], row["mem_len"])
    est = training_footprint(config, row["batch"], row["dtype"], "adam",
                             jit_compile=row["jit"], backend=row["backend"])
    items = {"weights_optimizer": est.weights + est.gradients + est.optimizer,
             "gradient_copies": est.gradient_copies, "memory": est.memory_state,
             "activations": sum(est.activations.values()), "program": est.program,
             "margin": est.margin, "total": est.total}
    baseline, peak, compiled = row["baseline_mib"], row["peak_mib"], row["compiled_mib"]
    return {**row, "est_parameters": est.parameters,
            **{f"est_{k}_mib": v / 2**20 for k, v in items.items()},
            "compiled_estimate_mib": None if compiled is None else
            baseline + est.with_compiled(compiled * 2**20).total / 2**20,
            "estimate_mib": baseline + est.total / 2**20,
            "ratio": peak / (baseline + est.total / 2**20),
            "step_ratio": (peak - baseline) / (est.total / 2**20)}


def run_child(name, dtype, batch, mem_len, jit, steps, backend="tensorflow"):
    """One row in a fresh process on `backend` ("tensorflow" or "jax", on its CPU)."""
    cmd = [sys.executable, "-m", "benchmarks.memory_bench", "--child", f"--configs={name}",
           f"--dtypes={dtype}", f"--batch={batch}", f"--mem_lens={mem_len}",
           f"--jit={'on' if jit else 'off'}", f"--steps={steps}", *common.thread_args()]
    proc = subprocess.run(cmd, cwd=common.REPO, capture_output=True, text=True,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND=backend,
                                   JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu")))
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"memory_bench child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def table(results):
    rows = ["| backend | config | dtype | XLA | batch | T / M | baseline RSS (MiB) | peak RSS "
            "(MiB) | estimate (MiB): baseline + step | peak / estimate | step peak / step "
            "estimate | peak / estimate from memory_analysis |",
            "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        compiled = r.get("compiled_estimate_mib")
        last = f"{r['peak_mib'] / compiled:.2f}" if compiled else "—"
        rows.append(
            f"| {r.get('backend', 'tensorflow')} | {r['config']} | {r['dtype']} | "
            f"{'on' if r['jit'] else 'off'} | {r['batch']} | {r['tgt_len']} / {r['mem_len']} | "
            f"{r['baseline_mib']:.0f} | {r['peak_mib']:.0f} | {r['estimate_mib']:.0f} = "
            f"{r['baseline_mib']:.0f} + {r['est_total_mib']:.0f} | {r['ratio']:.2f} | "
            f"{r['step_ratio']:.2f} | {last} |")
    ratios = [r["ratio"] for r in results]
    rows += ["", f"peak / estimate: {min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} rows "
             f"(target: within [{LOWEST_RATIO}, 1])."]
    return "\n".join(rows)


def main(argv=None):
    parser = common.add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--configs", default="bench")
    parser.add_argument("--dtypes", default="float32")
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--mem_lens", default="128,256,512,1024")
    parser.add_argument("--jit", default="off")
    parser.add_argument("--backends", default="tensorflow",
                        help="tensorflow, jax or both (JAX's step is always compiled)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rescore", default=None,
                        help="a JSON of earlier rows: their table with this checkout's estimate")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rescore:
        with open(args.rescore) as f:
            results = [estimated(row) for row in json.load(f)]
        print(table(results))
        common.dump_json(args.json, results)
        return results
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
    rows = [(b, *row) for b in args.backends.split(",")
            for row in itertools.product(configs, dtypes, jits if b == "tensorflow" else [True],
                                         mem_lens)]
    for backend, name, dtype, jit, m in rows:
        r = run_child(name, dtype, args.batch, m, jit, args.steps, backend)
        print(f"{backend} {name} {dtype} XLA {'on' if jit else 'off'} batch {args.batch} "
              f"mem_len {m}: "
              f"peak {r['peak_mib']:.0f} MiB, estimate {r['estimate_mib']:.0f} MiB "
              f"(ratio {r['ratio']:.2f}; step {r['peak_mib'] - r['baseline_mib']:.0f} MiB vs "
              f"{r['estimate_mib'] - r['baseline_mib']:.0f})", flush=True)
        results.append(r)
    print(table(results))
    common.dump_json(args.json, results)
    return results


if __name__ == "__main__":
    main()
