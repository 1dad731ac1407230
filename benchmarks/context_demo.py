"""`make demo-context`: how much context each of the paper's three architectures uses, at the
demo's size, in a few minutes on 2 CPU cores, through the tools a user runs.

1. `tfxl-prepare --corpus=python_stdlib` (bytes, segments of --tgt_len) into OUT/data;
2. `tfxl-train` three times on it, the `tiny` preset's sizes: `--architecture=transformer_xl`
   (memory --tgt_len), `transformer` (a fixed context of --tgt_len) and `lstm`, into
   OUT/transformer_xl, OUT/transformer, OUT/lstm;
3. `tfxl-context` on the three as one group: the RECL table, OUT/context/context.png and
   OUT/context/context.json.

    python -m benchmarks.context_demo [--out=demo_context_out] [--train_steps=1000]

Each step is skipped where its output exists (a run resumes or says it is done), so the same
command continues an interrupted demo. The plot needs matplotlib, the `plots` extra
(`make demo-context` installs it).
"""

import os
import subprocess
import sys
import time

from absl import app, flags

FLAGS = flags.FLAGS
ARCHITECTURES = ("transformer_xl", "transformer", "lstm")


def define_flags():
    flags.DEFINE_string("out", "demo_context_out", "Output directory.")
    flags.DEFINE_integer("train_steps", 1000, "Training steps of each model.")
    flags.DEFINE_integer("tgt_len", 32, "Segment length: the data's, every model's training "
                         "segment, the vanilla Transformer's context and Transformer-XL's "
                         "training memory.")
    flags.DEFINE_integer("positions", 200, "Targets scored at each context.")
    flags.DEFINE_list("contexts", [str(c) for c in range(8, 129, 8)], "The context grid.")


def tool(module, *args):
    """`python -m module args` (the tool as a user runs it); its output shown as it comes."""
    command = [sys.executable, "-m", module, *args]
    print("  $ " + " ".join(["python", "-m", module, *args]), flush=True)
    done = subprocess.run(command)
    if done.returncode:
        raise SystemExit(done.returncode)


def main(argv):
    del argv
    out = FLAGS.out
    data = os.path.join(out, "data")
    start = time.perf_counter()
    print(f"[1/3] the Python standard library, bytes, segments of {FLAGS.tgt_len}")
    if not os.path.exists(os.path.join(data, "manifest.json")):
        tool("tfxl.data.prepare", "--corpus=python_stdlib", f"--output_dir={data}",
             f"--tgt_len={FLAGS.tgt_len}")
    for i, architecture in enumerate(ARCHITECTURES, 1):
        print(f"[2/3] training {architecture} ({i}/{len(ARCHITECTURES)}): the tiny preset, "
              f"{FLAGS.train_steps} steps", flush=True)
        model_dir = os.path.join(out, architecture)
        tool("tfxl.train.main", f"--data_dir={data}", f"--model_dir={model_dir}",
             "--preset=tiny", f"--architecture={architecture}", f"--tgt_len={FLAGS.tgt_len}",
             f"--mem_len={FLAGS.tgt_len}", "--train_batch_size=16",
             f"--train_steps={FLAGS.train_steps}", "--steps_per_loop=100",
             "--learning_rate=2e-3", "--warmup_steps=100", "--clip=0.25", "--lease_settle=0")
    print("[3/3] loss by context length and RECL", flush=True)
    models = [f"--model={os.path.join(out, a)}" for a in ARCHITECTURES]
    tool("tfxl.analysis.context_main", *models,
         f"--data_dir={data}", "--split=valid", f"--contexts={','.join(FLAGS.contexts)}",
         f"--positions={FLAGS.positions}", f"--output_dir={os.path.join(out, 'context')}",
         "--overwrite")
    print(f"\nplot: {os.path.join(out, 'context', 'context.png')}\n"
          f"results: {os.path.join(out, 'context', 'context.json')}\n"
          f"whole demo: {time.perf_counter() - start:.0f} s")
    return 0


def run():
    define_flags()
    app.run(main)


if __name__ == "__main__":
    run()
