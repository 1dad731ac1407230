"""Benchmark: does the memory make document classification work? The run is
`benchmarks.classify_experiment.run_experiment` (its docstring says what runs) at the
benchmark's sizes (`BENCH_SIZES`: the dozen stdlib packages, a pretrained `tiny` LM, the
long-range probe); `make demo-classify` (benchmarks/classify_demo.py) runs the same code at
smaller sizes.

    python -m benchmarks.classify_bench [--work DIR] [--json benchmarks/classify_bench.json]
    python -m benchmarks.classify_bench --tables benchmarks/classify_bench.json

The numbers go to BENCHMARKS.md ("Document classification"), its tables printed by `--tables`.
"""

import argparse
import json
import os
import sys

from benchmarks import common  # first: TensorFlow's thread settings before Keras loads it
from benchmarks.classify_experiment import (BENCH_SIZES, MEMORY, READING_NAMES, READINGS,
                                            run_experiment)


def markdown_tables(results):
    """BENCHMARKS.md's tables, printed from a run's JSON (`--tables`): nothing copied by hand."""
    lines = []
    for name, by, what in (("stdlib", "by_tokens_read", "N tokens read"),
                           ("probe", "by_length", "document length (bytes)")):
        task = results.get(name)
        if not task:
            continue
        lines += [f"**{name}**: {task['train_documents']} training and "
                  f"{task['test_documents']} test documents, {len(task['labels'])} classes", "",
                  "| reading | accuracy | macro-F1 | tokens read | final train loss | "
                  "train docs/s | inference docs/s |", "|---|---:|---:|---:|---:|---:|---:|"]
        for reading in READINGS:
            r = task["readings"][reading]
            lines.append(f"| {READING_NAMES[reading]} | {r['accuracy']:.3f} | "
                         f"{r['macro_f1']:.3f} | {r['tokens_read']:,} | "
                         f"{r['final_train_loss']:.3f} | {r['train_documents_per_second']:.1f} | "
                         f"{r['inference']['documents_per_second']:.1f} |")
        keys = sorted(task["readings"][MEMORY][by], key=int)
        lines += ["", f"| accuracy by {what} | " + " | ".join(f"{int(k):,}" for k in keys) + " |",
                  "|---|" + "---:|" * len(keys)]
        for reading in READINGS:
            row = task["readings"][reading][by]
            lines.append(f"| {READING_NAMES[reading]} | " + " | ".join(
                f"{row[k]['accuracy']:.3f}" if k in row else "" for k in keys) + " |")
        lines += ["", "| training loss at the end of each stage | " + " | ".join(
            f"{stage['train_tokens']:,}-token documents" for stage in
            task["readings"][MEMORY]["stages"]) + " |",
            "|---|" + "---:|" * len(task["readings"][MEMORY]["stages"])]
        for reading in READINGS:
            lines.append(f"| {READING_NAMES[reading]} | " + " | ".join(
                f"{stage['losses'][-1]:.3f}" for stage in task["readings"][reading]["stages"])
                + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    parser = common.add_common_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    parser.add_argument("--work", default="/tmp/tfxl_classify_bench",
                        help="scratch directory (data, the LM)")
    parser.add_argument("--tables", metavar="JSON", help="print BENCHMARKS.md's tables from a "
                        "run's results and exit")
    parser.set_defaults(json=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                          "classify_bench.json"))
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.tables:
        with open(args.tables) as f:
            print(markdown_tables(json.load(f)))
        return
    common.setup(args)
    head = {"machine": common.machine_info(),
            "command": " ".join(["python -m benchmarks.classify_bench", *argv])}

    def save(results):
        with open(args.json, "w") as f:
            json.dump({**head, **results}, f, indent=1)
    results = run_experiment(args.work, BENCH_SIZES, save=save)
    save(results)
    print(f"results: {args.json} ({results['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
