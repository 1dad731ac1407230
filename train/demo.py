"""`make demo`: the main job end to end on the embedded corpus, in a few minutes on 2 CPU cores.

1. prepare: the running Python's standard library sources, byte-level (tfxl-prepare's
   `--corpus=python_stdlib`), into demo_out/data;
2. train: the `tiny` preset with memory through the same Runner as `tfxl-train`, into
   demo_out/model (TensorBoard logs, checkpoints, metrics.json);
3. evaluate valid bpc over every token with the training memory, with no memory (mem_len 0) and
   with longer evaluation memories, print the table and save demo_out/bpc_vs_memory.png.

    python -m train.demo [--train_steps=2000] [--out=demo_out]
"""

import os
import sys
import time

import tensorflow as tf
from absl import flags

from tfxl import cli
from tfxl.config import get_preset
from tfxl.data.manifest import load_manifest
from tfxl.data.prepare import PrepareConfig, prepare
from tfxl.json_files import write_json_atomically
from train.loop import Runner, check_or_store_config
from train.optimization import OptimizerParams
from train.png_plot import line_plot

FLAGS = flags.FLAGS


def define_flags():
    flags.DEFINE_string("out", "demo_out", "Output directory (data, model, results).")
    flags.DEFINE_integer("train_steps", 2000, "Training steps.")
    flags.DEFINE_integer("batch_size", 16, "Global batch (streams per step).")
    flags.DEFINE_integer("eval_tgt_len", 32, "Evaluation segment length.")
    flags.DEFINE_list("eval_mem_lens", ["0", "32", "64", "128", "256"],
                      "Evaluation memory lengths to plot.")


def main(argv):
    del argv
    data_dir = os.path.join(FLAGS.out, "data")
    model_dir = os.path.join(FLAGS.out, "model")
    if not os.path.exists(os.path.join(data_dir, "manifest.json")):
        print(f"[1/3] preparing the Python standard library corpus into {data_dir}")
        prepare(PrepareConfig(output_dir=data_dir, corpus="python_stdlib"), log=print)
    else:
        print(f"[1/3] reusing prepared data in {data_dir}")
    manifest = load_manifest(data_dir)

    config = get_preset("tiny", vocab_size=manifest["vocab_size"], dropout=0.1,
                        tgt_len=manifest["tgt_len"], mem_len=manifest["tgt_len"])
    check_or_store_config(model_dir, config, store=False)  # Runner.train stores it
    opt = OptimizerParams(learning_rate=2e-3, warmup_steps=100, min_lr_ratio=0.05,
                          train_steps=FLAGS.train_steps, clip=0.25)
    runner = Runner(config, tf.distribute.get_strategy(), data_dir, model_dir, FLAGS.batch_size,
                    opt, jit_compile=True, steps_per_loop=100)
    print(f"[2/3] training `tiny` ({runner.model.count_params():,} parameters) for "
          f"{FLAGS.train_steps} steps of {FLAGS.batch_size} x {config.tgt_len} bytes, "
          f"memory {config.mem_len}")
    runner.check_splits("valid")  # evaluated after training: a bad shard stops the demo now
    start = time.perf_counter()
    metrics = runner.train(save_every=500)
    if metrics.pop("nothing_to_do", False):  # results.json keeps the training run's metrics
        print(f"      nothing to do: {model_dir} is already trained to step {metrics['step']} "
              f"(delete it to train again)")
    else:
        print(f"      trained in {time.perf_counter() - start:.0f} s "
              f"({metrics['train_tokens_per_second']:,.0f} tokens/s)")

    print(f"[3/3] evaluating valid ({FLAGS.eval_tgt_len}-byte segments, every byte once)")
    results = []
    for mem_len in sorted({int(m) for m in FLAGS.eval_mem_lens} | {config.mem_len}):
        r = runner.evaluate("valid", batch_size=manifest["num_streams"],
                            tgt_len=FLAGS.eval_tgt_len, mem_len=mem_len)
        results.append(r)
    rows = {r["mem_len"]: r for r in results}
    longest = max(rows)
    table = [("without memory (mem_len 0)", rows[0]),
             (f"training memory (mem_len {config.mem_len})", rows[config.mem_len]),
             (f"longer eval memory (mem_len {longest})", rows[longest])]
    print()
    print(f"| {'valid split, tiny model':<34} | bpc    | tokens  |")
    print(f"|{'-' * 36}|--------|---------|")
    for name, r in table:
        print(f"| {name:<34} | {r['bpc']:.4f} | {r['tokens']:,} |")
    png = line_plot([r["mem_len"] for r in results], [r["bpc"] for r in results],
                    os.path.join(FLAGS.out, "bpc_vs_memory.png"),
                    title="valid bpc vs eval memory", x_label="eval memory length (bytes)",
                    y_label="bpc")
    write_json_atomically(os.path.join(FLAGS.out, "results.json"),
                          {"train": metrics, "eval": results})
    print(f"\nplot: {png}\nresults: {os.path.join(FLAGS.out, 'results.json')}")
    if not rows[config.mem_len]["bpc"] < rows[0]["bpc"]:
        print("warning: memory did not help on this run", file=sys.stderr)
    return 0


if __name__ == "__main__":
    cli.run(main, define_flags)
