"""`make demo-classify`: the classification benchmark's run (benchmarks/classify_experiment.py,
whose docstring says what runs) at the demo's sizes.

The demo, in a few minutes on 2 CPU cores (`SIZES["demo"]`: four packages, a briefly pretrained
LM, no probe), prints the three readings as a table, plots accuracy against tokens read to
OUT/accuracy_vs_tokens.png and writes everything to OUT/results.json:

    python -m benchmarks.classify_demo [--out=demo_classify_out] [--size=demo]

The plot needs matplotlib, the `plots` extra (`pip install '.[plots]'` in a clone of tfxl;
`make demo-classify` installs it).
The benchmark: `python -m benchmarks.classify_bench` (`BENCH_SIZES`).
"""

if __name__ == "__main__":  # `python -m`: TensorFlow quiet before the imports below load it
    from tfxl.cli.quiet import quiet_tensorflow
    quiet_tensorflow()

import dataclasses
import os

from absl import flags

from benchmarks.classify_experiment import (BENCH_SIZES, MEMORY, READING_NAMES, READINGS,
                                            SEGMENTS, TRUNCATION, run_experiment)
from tfxl import cli
from tfxl.files import write_json_atomically


# -- plot -----------------------------------------------------------------------------------------
def accuracy_vs_tokens_figure(task_result, title="test accuracy vs tokens read"):
    """Accuracy against tokens read (log2 axis) with memory and without; truncation's one
    point (the first T tokens) a dashed line."""
    from tfxl.train.demo import figure_class  # matplotlib, the plots extra, imported lazily
    fig = figure_class()(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.add_subplot()
    readings = task_result["readings"]
    for reading in (MEMORY, SEGMENTS):
        label = READING_NAMES[reading]
        points = sorted((int(n), r["accuracy"]) for n, r in
                        readings[reading]["by_tokens_read"].items())
        ax.plot(*zip(*points), marker="o", label=label)
    truncation = readings[TRUNCATION]
    ax.axhline(truncation["accuracy"], linestyle="--", color="grey",
               label=f"truncation (first {truncation['tokens_read']} tokens)")
    ax.set_xscale("log", base=2)
    ax.set(title=title, xlabel="tokens read (log2 scale)", ylabel="accuracy", ylim=(0, 1.02))
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


# -- the demo ------------------------------------------------------------------------------
FLAGS = flags.FLAGS

SIZES = {
    # A few minutes on 2 cores: four packages, a briefly pretrained LM, 512 tokens read in
    # training, more epochs than the benchmark's; no probe.
    "demo": dataclasses.replace(
        BENCH_SIZES, packages=("asyncio", "email", "idlelib", "lib2to3"), lm_steps=200,
        max_per_package=20,
        mem_len=1024, train_tokens=512, grad_segments=4, epochs=8, learning_rate=2e-3,
        tokens_read=(128, 256, 512, 1024, 2048), probe_train=0),
    # The test's: a fresh 2-layer D 16 backbone, 3 documents per package, short reads, eager.
    "smallest": dataclasses.replace(
        BENCH_SIZES, model=dict(d_model=16, n_head=2, d_head=8, d_inner=32), lm_steps=0,
        max_per_package=3, test_fraction=0.4, segment_len=16, mem_len=32, train_tokens=32,
        grad_segments=2,
        epochs=1, tokens_read=(16, 32), probe_train=0, eager=True),
}


def define_flags():
    flags.DEFINE_string("out", "demo_classify_out", "Output directory (data, LM, results, plot).")
    flags.DEFINE_enum("size", "demo", list(SIZES), "demo: the few-minute run; smallest: a "
                      "seconds-long check of the pipeline (fresh backbone, no pretraining).")
    flags.DEFINE_string("stdlib_root", None, "The library to read (default: the running "
                        "Python's).")


def table(task_result):
    """The printed comparison: one row per reading."""
    readings = task_result["readings"]
    width = max(map(len, READING_NAMES.values()))
    lines = [f"| {'reading':<{width}} | tokens read | accuracy | macro-F1 |",
             f"|{'-' * (width + 2)}|-------------|----------|----------|"]
    lines += [f"| {READING_NAMES[reading]:<{width}} | {r['tokens_read']:>11} | "
              f"{r['accuracy']:>8.3f} | {r['macro_f1']:>8.3f} |"
              for reading, r in ((reading, readings[reading]) for reading in READINGS)]
    return "\n".join(lines)


def main(argv):
    del argv
    from tfxl.train.demo import figure_class, save_png
    figure_class()  # a missing plots extra stops the demo now, not after minutes of training
    sizes = SIZES[FLAGS.size]
    results = run_experiment(FLAGS.out, sizes, FLAGS.stdlib_root)
    print()
    print(table(results["stdlib"]))
    plot = os.path.join(FLAGS.out, "accuracy_vs_tokens.png")
    save_png(accuracy_vs_tokens_figure(results["stdlib"]), plot)
    write_json_atomically(os.path.join(FLAGS.out, "results.json"), results)
    print(f"\nplot: {plot}\nresults: {os.path.join(FLAGS.out, 'results.json')} "
          f"({results['seconds']:.0f} s)")
    return 0


def run():
    cli.run(main, define_flags)


if __name__ == "__main__":
    run()
