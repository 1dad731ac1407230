"""`make demo`: the main job end to end on the embedded corpus, in a few minutes on 2 CPU cores.

1. prepare: the running Python's standard library sources, byte-level (tfxl-prepare's
   `--corpus=python_stdlib`), into demo_out/data;
2. train: the `tiny` preset with memory through the same TrainingRun and task as `tfxl-train`, into
   demo_out/model (TensorBoard logs, checkpoints, metrics.json);
3. evaluate valid bpc over every token with the training memory, with no memory (mem_len 0) and
   with longer evaluation memories, print the table, and plot demo_out/bpc_vs_memory.png (bpc
   against evaluation memory length on a log2 axis) and demo_out/training_loss.png (the loss
   curve of the model's train log, train/records/train_log.py).

    python -m tfxl.train.demo [--train_steps=2000] [--out=demo_out]

The plots need matplotlib, an extra (`pip install '.[plots]'` in a clone of tfxl; `make demo`
installs it) that tfxl itself never imports.
"""

if __name__ == "__main__":  # `python -m`: TensorFlow quiet before the imports below load it
    from tfxl.cli.quiet import quiet_tensorflow
    quiet_tensorflow()

import io
import os
import sys
import time

from absl import flags

from tfxl import cli
from tfxl.config import get_preset
from tfxl.data.manifest import load_manifest
from tfxl.deferred import deferred_import
from tfxl.files import write_json_atomically
from tfxl.model_dir import check_or_store_config
from tfxl.train.records.train_log import read_train_log

tf = deferred_import("tensorflow")

FLAGS = flags.FLAGS


def define_flags():
    flags.DEFINE_string("out", "demo_out", "Output directory (data, model, results).")
    flags.DEFINE_integer("train_steps", 2000, "Training steps.")
    flags.DEFINE_integer("batch_size", 16, "Global batch (streams per step).")
    flags.DEFINE_integer("eval_tgt_len", 32, "Evaluation segment length.")
    flags.DEFINE_list("eval_mem_lens", ["0", "32", "64", "128", "256"],
                      "Evaluation memory lengths to plot.")


def figure_class():
    """matplotlib's Figure (no pyplot: no global state, PNGs through Agg), imported only here."""
    try:
        from matplotlib.figure import Figure  # the plots extra: only the demo needs it
    except ImportError:
        raise ValueError("the demo's plots need matplotlib, which tfxl itself does not: "
                         "pip install '.[plots]' in a clone of tfxl "
                         "(make demo installs it)") from None
    return Figure


def bpc_vs_memory_figure(results, training_mem_len):
    """valid bpc against evaluation memory length, memory lengths spaced proportionally (log2);
    mem_len 0, which a log axis cannot place, is the dashed "no memory" line."""
    fig = figure_class()(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.add_subplot()
    points = sorted((r["mem_len"], r["bpc"]) for r in results if r["mem_len"] > 0)
    if points:
        mem_lens, bpcs = zip(*points)
        ax.plot(mem_lens, bpcs, marker="o", label="with memory")
        ax.set_xscale("log", base=2)
        ax.set_xticks(mem_lens, [str(m) for m in mem_lens])
    for r in results:
        if r["mem_len"] == 0:
            ax.axhline(r["bpc"], linestyle="--", color="grey", label="no memory (mem_len 0)")
    ax.axvline(training_mem_len, linestyle=":", color="black",
               label=f"training memory ({training_mem_len})")
    ax.set(title="valid bpc vs evaluation memory", ylabel="bpc",
           xlabel="evaluation memory length (tokens, log2 scale)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


def training_loss_figure(records):
    """The training loss per step of the train log's records (read_train_log)."""
    fig = figure_class()(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.add_subplot()
    ax.plot([r["step"] for r in records], [r["loss"] for r in records], linewidth=1)
    ax.set(title="training loss", xlabel="step", ylabel="loss (nats per token)")
    ax.grid(True, alpha=0.3)
    return fig


def save_png(figure, path):
    """The figure as a PNG at `path` through tf.io.gfile (matplotlib opens local files only)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(buffer.getvalue())


def write_plots(out_dir, results, training_mem_len, model_dir):
    """Writes out_dir/bpc_vs_memory.png and out_dir/training_loss.png (the train log of
    `model_dir`); returns their paths."""
    paths = (os.path.join(out_dir, "bpc_vs_memory.png"),
             os.path.join(out_dir, "training_loss.png"))
    save_png(bpc_vs_memory_figure(results, training_mem_len), paths[0])
    save_png(training_loss_figure(read_train_log(model_dir)), paths[1])
    return paths


def main(argv):
    # Here, not at the top: --help, which defines the flags only, loads no TensorFlow.
    from tfxl.data.prepare import PrepareConfig, prepare
    from tfxl.train.backends import configure_process
    from tfxl.train.tasks.language_model import LanguageModelTask
    from tfxl.train.loop.optimization import OptimizerParams
    from tfxl.train.loop.run import RunOptions, TrainingRun, TrainingStopped
    del argv
    figure_class()  # a missing extra stops the demo now, not after minutes of training
    data_dir = os.path.join(FLAGS.out, "data")
    model_dir = os.path.join(FLAGS.out, "model")
    if not tf.io.gfile.exists(os.path.join(data_dir, "manifest.json")):
        print(f"[1/3] preparing the Python standard library corpus into {data_dir}")
        prepare(PrepareConfig(output_dir=data_dir, corpus="python_stdlib"), log=print)
    else:
        print(f"[1/3] reusing prepared data in {data_dir}")
    manifest = load_manifest(data_dir)

    config = get_preset("tiny", vocab_size=manifest["vocab_size"], dropout=0.1,
                        tgt_len=manifest["tgt_len"], mem_len=manifest["tgt_len"])
    check_or_store_config(model_dir, config, store=False)  # TrainingRun.train stores it
    opt = OptimizerParams(learning_rate=2e-3, warmup_steps=100, min_lr_ratio=0.05,
                          train_steps=FLAGS.train_steps, clip=0.25)
    configure_process(mixed_precision="float32", seed=0)  # RunOptions' own
    runner = TrainingRun(LanguageModelTask(config, data_dir=data_dir),
                         strategy=tf.distribute.get_strategy(),
                         options=RunOptions(model_dir=model_dir, global_batch=FLAGS.batch_size,
                                            optimizer=opt, jit_compile=True, steps_per_loop=100))
    print(f"[2/3] training `tiny` ({runner.model.count_params():,} parameters) for "
          f"{FLAGS.train_steps} steps of {FLAGS.batch_size} x {config.tgt_len} bytes, "
          f"memory {config.mem_len}")
    runner.data.check_splits("valid")  # evaluated after training: a bad shard stops the demo now
    start = time.perf_counter()
    try:
        metrics = runner.train(save_every=500)
    except TrainingStopped as stopped:  # SIGTERM/SIGINT: saved; the same command resumes
        print(stopped)
        return stopped.exit_status
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
    plots = write_plots(FLAGS.out, results, config.mem_len, model_dir)
    write_json_atomically(os.path.join(FLAGS.out, "results.json"),
                          {"train": metrics, "eval": results})
    print(f"\nplots: {', '.join(plots)}\nresults: {os.path.join(FLAGS.out, 'results.json')}")
    if not rows[config.mem_len]["bpc"] < rows[0]["bpc"]:
        print("warning: memory did not help on this run", file=sys.stderr)
    return 0


def run():
    cli.run(main, define_flags)


if __name__ == "__main__":
    run()
