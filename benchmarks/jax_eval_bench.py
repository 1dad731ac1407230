"""Benchmark: JAX evaluation tokens/s, one compiled host loop against a step per segment.

`JaxEvaluator.evaluate` (train/loop/jax_evaluator.py: each host loop one jitted `lax.scan` over up
to steps_per_loop segments, the ring carried through it, the sums read once per loop) against the
loop it replaced (`PerStepJaxEvaluator` below: one jitted step per segment, its sums read after
each, which waits for the device at every step). Both evaluators share the model (random weights
from a fixed seed: speed does not depend on them), the data (`tfxl-prepare` of a generated corpus,
bytes) and the settings, and their first pass (the compiles) is not timed. Then `--rounds` rounds
of one timed pass each, the order alternated round by round (the machine is shared: both see its
load alike). A side's figure is the median of its rounds, with their range; after / before is
the median of the rounds' own ratios. Each row also checks that both give the same loss (1e-6
relative).

Runs on JAX (KERAS_BACKEND=jax, set here) on whatever JAX finds (`JAX_PLATFORMS=cpu` for the
CPU), data parallel over every device.

    python -m benchmarks.jax_eval_bench [--configs tiny,bench] [--batches 50]
        [--steps_per_loop 20] [--rounds 5] [--dtype float32] [--json out.json]
"""

import argparse
import os
import statistics
import sys
import time

os.environ["KERAS_BACKEND"] = "jax"  # before keras is imported, here or by anything below

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common

BATCH = 16
SIDES = ("before", "after")


def per_step_evaluator_class():
    """`PerStepJaxEvaluator`: JaxEvaluator with the host loop it had before (kept here, for this
    comparison only)."""
    import jax
    import numpy as np
    from tfxl.train.loop.jax_evaluator import JaxEvaluator

    class PerStepJaxEvaluator(JaxEvaluator):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._step = jax.jit(self._step_fn, static_argnums=(5,), donate_argnums=(2,))

        def _step_fn(self, trainable, non_trainable, memory, position_keys, batch,
                     same_length):
            from keras import ops
            (nll, new_memory), _ = self.model.stateless_call(
                trainable, non_trainable, batch["inputs"], memory, reset=batch["reset"],
                targets=batch["targets"], training=False, same_length=same_length,
                position_keys=position_keys)
            mask = ops.cast(batch["target_mask"], "float32")
            return ops.sum(ops.cast(nll, "float32") * mask), ops.sum(mask), new_memory

        def eval_begin(self, s):
            strategy, model = self.strategy, self.model
            memory = jax.tree_util.tree_map(
                strategy.split_along_batch,
                model.init_key_value_ring(s["batch_size"], s["tgt_len"], s["mem_len"]))
            position_keys = model.position_keys(s["mem_len"] + s["tgt_len"], s["clamp_len"])
            trainable = [v.value for v in model.trainable_variables]
            non_trainable = [v.value for v in model.non_trainable_variables]
            state = {"memory": memory}

            def loop(iterator, n):
                total = count = 0.0
                for _ in range(int(n)):
                    local = next(iterator)
                    batch = {key: strategy.global_array(value) for key, value in local.items()}
                    nll_sum, tokens, state["memory"] = self._step(
                        trainable, non_trainable, state["memory"], position_keys, batch,
                        s["same_length"])
                    total, count = total + float(nll_sum), count + float(tokens)
                return np.float64(total), np.float64(count)

            return loop

    return PerStepJaxEvaluator


def measure(config_name, *, batches, steps_per_loop, rounds, dtype, data_root):
    """One row: both evaluators on config `config_name` at its T = M, `batches` segments of
    BATCH rows a pass."""
    import keras
    from tfxl.data.manifest import load_manifest
    from tfxl.tpu.jax_mesh import resolve_distribution
    from tfxl.train.tasks.datasets import DistributedData
    from tfxl.train.loop.jax_evaluator import JaxEvaluator
    from tfxl.train.tasks.language_model import build_model

    config = common.CONFIGS[config_name]()
    keras.config.set_dtype_policy(dtype)
    keras.utils.set_random_seed(0)
    strategy = resolve_distribution("data_parallel")
    model = build_model(config, strategy)
    data_dir = common.prepare_data(data_root, config.tgt_len)
    data = DistributedData(strategy, data_dir, load_manifest(data_dir))
    evaluators = {"before": per_step_evaluator_class()(model, strategy, data, BATCH,
                                                      steps_per_loop),
                  "after": JaxEvaluator(model, strategy, data, BATCH, steps_per_loop)}
    settings = dict(tgt_len=config.tgt_len, mem_len=config.mem_len, clamp_len=-1,
                    same_length=False, max_batches=batches)
    losses = {side: evaluators[side].evaluate("valid", **settings)["loss"] for side in SIDES}
    seconds = {side: [] for side in SIDES}
    before_cpu = common.cpu_snapshot()
    tokens = None
    for round_ in range(rounds):
        for side in SIDES if round_ % 2 == 0 else SIDES[::-1]:
            start = time.perf_counter()
            tokens = evaluators[side].evaluate("valid", **settings)["tokens"]
            seconds[side].append(time.perf_counter() - start)
    foreign = common.foreign_cpu_share(before_cpu, common.cpu_snapshot())
    rates = {side: [tokens / s for s in seconds[side]] for side in SIDES}
    ratios = [a / b for a, b in zip(rates["after"], rates["before"])]
    row = {"config": config_name, "tgt_len": config.tgt_len, "mem_len": config.mem_len,
           "batch": BATCH, "batches": batches, "steps_per_loop": steps_per_loop,
           "dtype": dtype, "devices": strategy.num_replicas_in_sync, "rounds": rounds,
           "tokens": tokens, "ratio": statistics.median(ratios), "ratios": ratios,
           "same_loss": abs(losses["after"] - losses["before"]) <= 1e-6 * abs(losses["before"]),
           "foreign_cpu": foreign}
    for side in SIDES:
        row[side] = {"tokens_per_s": statistics.median(rates[side]), "min": min(rates[side]),
                     "max": max(rates[side]), "each": rates[side], "loss": losses[side]}
    print(f"{config_name} T={config.tgt_len} M={config.mem_len} {dtype}: "
          + ", ".join(f"{side} {row[side]['tokens_per_s']:,.0f} tokens/s" for side in SIDES)
          + f", after/before {row['ratio']:.2f}x (rounds: "
          + ", ".join(f"{r:.2f}" for r in ratios) + ")", flush=True)
    return row


def host_info():
    import jax
    info = common.machine_info()
    devices = jax.devices()
    info.update(jax=jax.__version__,
                jax_devices=f"{len(devices)} x {devices[0].device_kind} ({devices[0].platform})")
    return info


def table(rows):
    lines = ["| config | T / M | batch × segments (loop) | dtype | before: a step per segment "
             "(tokens/s) | after: one scan per loop (tokens/s) | after / before (each round) "
             "| same loss |",
             "| --- | ---: | ---: | --- | ---: | ---: | ---: | --- |"]
    for r in rows:
        sides = [f"{r[s]['tokens_per_s']:,.0f} ({r[s]['min']:,.0f}–{r[s]['max']:,.0f})"
                 for s in SIDES]
        lines.append(f"| {r['config']} | {r['tgt_len']} / {r['mem_len']} | {r['batch']} × "
                     f"{r['batches']} ({r['steps_per_loop']}) | {r['dtype']} | {sides[0]} | "
                     f"{sides[1]} | {r['ratio']:.2f}× ("
                     + ", ".join(f"{x:.2f}" for x in r["ratios"]) + ") | "
                     f"{'yes' if r['same_loss'] else 'NO'} |")
    return "\n".join(lines)


def main(argv=None):
    parser = common.add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--configs", default="tiny,bench")
    parser.add_argument("--batches", type=int, default=50, help="segments a pass")
    parser.add_argument("--steps_per_loop", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--data_root", default=None)
    args = parser.parse_args(argv)
    common.setup(args)
    rounds, batches = (3, 20) if args.quick else (args.rounds, args.batches)
    rows = []
    with common.temp_dir() as tmp:
        for name in args.configs.split(","):
            rows.append(measure(name, batches=batches, steps_per_loop=args.steps_per_loop,
                                rounds=rounds, dtype=args.dtype,
                                data_root=args.data_root or tmp))
    host = host_info()
    print("\n" + " · ".join(f"{k}: {v}" for k, v in host.items()))
    print(table(rows))
    common.dump_json(args.json, {"host": host, "rows": rows})
    return rows


if __name__ == "__main__":
    main()
