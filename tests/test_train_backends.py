"""benchmarks/train_backends.py reads the trainer's own progress lines: the format that
train/loop/controller.py's `ProgressLines` prints is the one it parses, and its summary takes the
median and range over the rounds and the JAX/TensorFlow ratio round by round."""

import contextlib
import io

import numpy as np
import pytest

from benchmarks import train_backends
from tfxl.train.loop.controller import ProgressLines


def test_the_progress_lines_the_trainer_prints_are_the_ones_read():
    lines = ProgressLines(train_steps=40, metric="bpc", units_per_step=512)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        lines({"loss": np.array([2.5, 2.25]), "step": 20, "seconds": 0.5})
        lines({"loss": np.array([float("nan")]), "step": 40, "seconds": 2.0})
    first, second = train_backends.progress_rates("plan: ...\n" + printed.getvalue())
    assert first == (20, 2.25, 2048.0)
    assert second[0] == 40 and np.isnan(second[1]) and second[2] == 256.0


def test_the_summary_is_the_median_and_range_and_the_ratio_is_taken_per_round():
    runs = [{"trainer": name, "tokens_per_s": rate, "run_tokens_per_s": rate / 2,
             "final_loss": 1.0, "foreign_cpu": 0.5}
            for name, rate in [("tf", 100), ("jax", 300), ("tf", 200), ("jax", 200),
                               ("tf", 400), ("jax", 500)]]
    summary = train_backends.summarize(runs, ["tf", "jax"])
    assert (summary["tf"]["tokens_per_s"], summary["tf"]["min"], summary["tf"]["max"]) == (
        200, 100, 400)
    assert summary["tf"]["jax_ratios"] == [3.0, 1.0, 1.25]
    assert summary["tf"]["jax_ratio"] == 1.25  # not 300 / 200: the rounds' own ratios
    assert "jax_ratio" not in summary["jax"]
    assert "| TensorFlow | 200 (100–400) | 100 | 1.0000 | 1.25× (3.00, 1.00, 1.25) |" in (
        train_backends.table(summary))


@pytest.mark.parametrize("line", ["step 1/2: loss 1.0, 5 steps/s", "loss 1.0, 5 tokens/s"])
def test_other_lines_are_not_read_as_progress(line):
    assert train_backends.progress_rates(line) == []
