"""Benchmark: `tfxl-train` on TensorFlow against `tfxl-train` on JAX, on this CPU.

Each run is one `tfxl-train` process (`python -m tfxl.train.main`, what the console script runs)
with the same flags on a corpus generated and prepared with `tfxl-prepare` (bytes) in a temp
dir; only the backend differs: TensorFlow without and with `--jit_compile`, and JAX
(`KERAS_BACKEND=jax JAX_PLATFORMS=cpu`, XLA always; the default strategy: data_parallel over the
one CPU device). The runs are interleaved, one of each per round for `--rounds` rounds, the
order rotated each round, so that every trainer sees the machine's load alike.

The measure is the steady state: the trainer prints one progress line per host loop (`step 40/120:
loss ..., 2,244 tokens/s`, train/loop/controller.py's `ProgressLines`); the first `--skip_loops`
loops are dropped and the median of the rest is the run's tokens/s. One is dropped by default: the
first
loop traces and compiles on every backend. The whole run's `train_tokens_per_second` of
metrics.json (start-up and compilation included) is kept beside it. Per trainer: the median over
the rounds and their range; the JAX/TensorFlow ratio is the median of the rounds' own ratios (runs
of one round are minutes apart, not hours).

    python -m benchmarks.train_backends [--rounds 3] [--trainers tf,tf_xla,jax]
        [--train_steps 120] [--steps_per_loop 20] [--skip_loops 1] [--out results.json]

The model (`--model_flags`): 4 layers, d_model 256, 4 heads x 64, d_inner 1024, T = M = 64,
batch 8, float32, dropout 0.1; 46-91 s a process on a shared 2-core host. The seed is the same,
but each backend draws its own initial weights from it, so the losses differ a little.
"""

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common

MODEL_FLAGS = ("--n_layer=4", "--d_model=256", "--n_head=4", "--d_head=64", "--d_inner=1024",
               "--tgt_len=64", "--mem_len=64", "--train_batch_size=8",
               "--mixed_precision=float32")
# name -> (what the table calls it, its environment, its extra flags)
TRAINERS = {
    "tf": ("TensorFlow", {"KERAS_BACKEND": "tensorflow"}, ("--nojit_compile",)),
    "tf_xla": ("TensorFlow, --jit_compile", {"KERAS_BACKEND": "tensorflow"},
               ("--jit_compile",)),
    "jax": ("JAX (XLA)", {"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}, ()),
}
PROGRESS = re.compile(r"^step (\d+)/(\d+): loss ([-\d.naif]+).*, ([\d,.]+) tokens/s$")


def progress_rates(stdout):
    """[(step, loss, tokens/s)] of each host loop's progress line."""
    loops = []
    for line in stdout.splitlines():
        match = PROGRESS.match(line.strip())
        if match:
            loops.append((int(match[1]), float(match[3]),
                          float(match[4].replace(",", ""))))
    return loops


def run_trainer(name, data_dir, model_dir, *, train_steps, steps_per_loop, skip_loops,
                model_flags=MODEL_FLAGS):
    """One `tfxl-train` process of trainer `name`: its steady and whole-run tokens/s."""
    _, env_overrides, extra = TRAINERS[name]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [common.REPO,
                                                       os.environ.get("PYTHONPATH")])),
           **env_overrides}
    cmd = [sys.executable, "-m", "tfxl.train.main", f"--data_dir={data_dir}",
           f"--model_dir={model_dir}", *model_flags, *extra, f"--train_steps={train_steps}",
           f"--steps_per_loop={steps_per_loop}", "--save_every=0"]
    before, started = common.cpu_snapshot(), time.perf_counter()
    done = subprocess.run(cmd, cwd=common.REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    foreign = common.foreign_cpu_share(before, common.cpu_snapshot())
    loops = progress_rates(done.stdout)
    if done.returncode or len(loops) <= skip_loops:
        raise RuntimeError(f"{name}: tfxl-train exited {done.returncode} after {len(loops)} "
                           f"host loops:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    with open(os.path.join(model_dir, "metrics.json")) as f:
        metrics = json.load(f)
    steady = [rate for _, _, rate in loops[skip_loops:]]
    return {"trainer": name, "tokens_per_s": statistics.median(steady),
            "loop_tokens_per_s": [rate for _, _, rate in loops],
            "run_tokens_per_s": metrics["train_tokens_per_second"],
            "final_loss": loops[-1][1], "wall_s": wall, "foreign_cpu": foreign}


def summarize(runs, trainers):
    """Per trainer: median and range of the rounds' tokens/s; JAX / each TensorFlow trainer:
    the median of the per-round ratios."""
    by_trainer = {name: [r for r in runs if r["trainer"] == name] for name in trainers}
    summary = {}
    for name, rows in by_trainer.items():
        rates = [r["tokens_per_s"] for r in rows]
        summary[name] = {
            "label": TRAINERS[name][0], "rounds": len(rows),
            "tokens_per_s": statistics.median(rates), "min": min(rates), "max": max(rates),
            "run_tokens_per_s": statistics.median(r["run_tokens_per_s"] for r in rows),
            "final_loss": statistics.median(r["final_loss"] for r in rows),
            "foreign_cpu": statistics.median(r["foreign_cpu"] for r in rows),
        }
    if "jax" in by_trainer:
        for name in trainers:
            if name == "jax":
                continue
            ratios = [j["tokens_per_s"] / t["tokens_per_s"]
                      for j, t in zip(by_trainer["jax"], by_trainer[name])]
            summary[name]["jax_ratio"] = statistics.median(ratios)
            summary[name]["jax_ratios"] = ratios
    return summary


def table(summary):
    rows = ["| trainer | steady tokens/s, median (range) | whole run | final loss | "
            "JAX / this (each round) |",
            "| --- | ---: | ---: | ---: | ---: |"]
    for s in summary.values():
        ratio = ("—" if "jax_ratio" not in s else
                 f"{s['jax_ratio']:.2f}× ({', '.join(f'{r:.2f}' for r in s['jax_ratios'])})")
        rows.append(f"| {s['label']} | {s['tokens_per_s']:,.0f} ({s['min']:,.0f}–{s['max']:,.0f})"
                    f" | {s['run_tokens_per_s']:,.0f} | {s['final_loss']:.4f} | {ratio} |")
    return "\n".join(rows)


def versions():
    """The installed versions of what the trainers run on (read without importing them)."""
    import importlib.metadata
    found = {}
    for name in ("tensorflow", "keras", "jax", "jaxlib"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def commit():
    """The checkout's commit, with "+changes" where its tracked files differ from it."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=common.REPO, capture_output=True,
                              text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD")
    return head and head + ("+changes" if git("status", "--porcelain", "-uno") else "")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trainers", default=",".join(TRAINERS))
    parser.add_argument("--train_steps", type=int, default=120)
    parser.add_argument("--steps_per_loop", type=int, default=20)
    parser.add_argument("--skip_loops", type=int, default=1,
                        help="host loops left out of the steady state (compilation)")
    parser.add_argument("--model_flags", default=" ".join(MODEL_FLAGS),
                        help="tfxl-train's model and batch flags, the same for every trainer")
    parser.add_argument("--out", default=None, help="also write every run and the summary here")
    args = parser.parse_args(argv)
    trainers = args.trainers.split(",")
    unknown = sorted(set(trainers) - set(TRAINERS))
    if unknown:
        parser.error(f"unknown trainers {unknown}: choose from {list(TRAINERS)}")
    model_flags = tuple(args.model_flags.split())
    tgt_len = int(next((f.split("=", 1)[1] for f in model_flags if f.startswith("--tgt_len=")),
                       64))
    started = time.perf_counter()
    runs = []
    with common.temp_dir() as tmp:
        data_dir = common.prepare_data(tmp, tgt_len)
        for round_ in range(args.rounds):
            shift = round_ % len(trainers)
            for name in trainers[shift:] + trainers[:shift]:
                model_dir = os.path.join(tmp, f"model_{name}_{round_}")
                result = run_trainer(name, data_dir, model_dir, train_steps=args.train_steps,
                                     steps_per_loop=args.steps_per_loop,
                                     skip_loops=args.skip_loops, model_flags=model_flags)
                result["round"] = round_ + 1
                runs.append(result)
                print(f"round {round_ + 1} {name}: {result['tokens_per_s']:,.0f} tokens/s "
                      f"steady, loops {[round(r) for r in result['loop_tokens_per_s']]}, "
                      f"{result['wall_s']:.0f} s, other tenants "
                      f"{100 * result['foreign_cpu']:.0f}%", flush=True)
    summary = summarize(runs, trainers)
    print()
    print(table(summary))
    payload = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{common.cpu_model()}, {os.cpu_count()} logical CPUs ({common.cpu_flags()})",
        "versions": versions(), "commit": commit(),
        "model_flags": list(model_flags), "train_steps": args.train_steps,
        "steps_per_loop": args.steps_per_loop, "skip_loops": args.skip_loops,
        "wall_s": time.perf_counter() - started, "runs": runs, "summary": summary,
    }
    common.dump_json(args.out, payload)
    return payload


if __name__ == "__main__":
    main()
