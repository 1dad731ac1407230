"""The demo's plots (matplotlib: the `plots` extra, also in `test`): bpc against evaluation memory
length on a proportional log2 axis, and the training loss curve of the train log."""

import json
import sys

import numpy as np
import pytest

from tfxl.train import demo

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
RESULTS = [{"split": "valid", "mem_len": m, "bpc": b, "tokens": 1000}
           for m, b in ((0, 3.1), (32, 2.6), (64, 2.4), (128, 2.35), (1024, 2.3))]


def write_log(model_dir, losses):
    """A model_dir whose train log holds `losses` from step 1, in two parts."""
    records = [{"step": i + 1, "loss": loss, "grad_norm": 1.0} for i, loss in enumerate(losses)]
    (model_dir / "train_log").mkdir(parents=True)
    for part in (records[:2], records[2:]):
        (model_dir / "train_log" / f"{part[0]['step']:010d}-{part[-1]['step']:010d}.jsonl"
         ).write_text("".join(json.dumps(r) + "\n" for r in part))
    return model_dir


def test_write_plots_writes_both_pngs(tmp_path):
    model_dir = write_log(tmp_path / "model", [5.0, 4.0, 3.5, 3.2])
    paths = demo.write_plots(str(tmp_path), RESULTS, 64, str(model_dir))
    assert [p.rsplit("/", 1)[-1] for p in paths] == ["bpc_vs_memory.png", "training_loss.png"]
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 5000


def test_plots_and_log_in_a_bucket_go_through_gfile(tmp_path, monkeypatch):
    """--out in a bucket (ram:// stands for one): the log is read and the PNGs written through
    tf.io.gfile; no local folder named like the bucket appears."""
    import tensorflow as tf
    monkeypatch.chdir(tmp_path)
    local = write_log(tmp_path / "model", [5.0, 4.0, 3.5])
    tf.io.gfile.makedirs("ram://demo-test/model/train_log")
    for part in sorted((local / "train_log").iterdir()):
        tf.io.gfile.copy(str(part), f"ram://demo-test/model/train_log/{part.name}")
    paths = demo.write_plots("ram://demo-test", RESULTS, 64, "ram://demo-test/model")
    for path in paths:
        with tf.io.gfile.GFile(path, "rb") as f:
            assert f.read().startswith(PNG_SIGNATURE)
    assert [r["loss"] for r in demo.read_train_log("ram://demo-test/model")] == [5.0, 4.0, 3.5]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_memory_lengths_are_spaced_proportionally_on_a_log2_axis():
    ax = demo.bpc_vs_memory_figure(RESULTS, training_mem_len=64).axes[0]
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
    line = ax.get_lines()[0]
    assert list(line.get_xdata()) == [32, 64, 128, 1024]  # mem_len 0 has no place on a log axis
    assert list(line.get_ydata()) == [2.6, 2.4, 2.35, 2.3]
    x = ax.transData.transform(np.column_stack([[32, 64, 128, 1024], [2.5] * 4]))[:, 0]
    steps = np.diff(x)  # each doubling the same distance: 32->64->128, then 3 doublings to 1024
    assert steps[0] == pytest.approx(steps[1]) and steps[2] == pytest.approx(3 * steps[0])
    no_memory = [l for l in ax.get_lines() if l.get_label() == "no memory (mem_len 0)"]
    assert len(no_memory) == 1 and list(no_memory[0].get_ydata()) == [3.1, 3.1]


def test_training_loss_curve_is_every_logged_step(tmp_path):
    losses = [5.0, 4.0, 3.5, 3.2, 3.3]
    records = demo.read_train_log(str(write_log(tmp_path / "model", losses)))
    line = demo.training_loss_figure(records).axes[0].get_lines()[0]
    assert list(line.get_xdata()) == [1, 2, 3, 4, 5] and list(line.get_ydata()) == losses


def test_without_matplotlib_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails as if missing
    with pytest.raises(ValueError, match=r"pip install '\.\[plots\]' in a clone of tfxl"):
        demo.figure_class()


def _make_demo_dry_run(tmp_path, stamps):
    """What `make -n demo` would run in a copy of the checkout's build files, with a .venv whose
    python exists and the install stamps `stamps` present (newer than setup.cfg)."""
    import os
    import shutil
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    tmp_path.mkdir()
    for name in ("Makefile", "setup.cfg", "pyproject.toml"):
        shutil.copy(root / name, tmp_path / name)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").write_text("")
    for stamp in stamps:
        (tmp_path / ".venv" / stamp).write_text("")
        os.utime(tmp_path / ".venv" / stamp, (2e9, 2e9))  # newer than the copied build files
    env = {**os.environ, "UV_FIND_LINKS": ""}
    return subprocess.run(["make", "-n", "demo", "demo-classify"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, check=True).stdout


def test_make_demo_installs_only_what_the_demo_needs(tmp_path):
    fresh = _make_demo_dry_run(tmp_path / "fresh", ())
    assert "'.[plots]'" in fresh and "[test]" not in fresh, fresh
    assert fresh.count("uv pip install") == 1, fresh  # once for both demos
    # A .venv of `make install` (the test extra, plots included) is used as it is.
    tested = _make_demo_dry_run(tmp_path / "tested", (".installed",))
    assert "pip install" not in tested, tested
    assert "tfxl.train.demo" in tested and "benchmarks.classify_demo" in tested


@pytest.mark.large
def test_the_demo_table_is_the_same_for_the_same_seed(tmp_path):
    """The README's table is reproducible: the same data, Python, TensorFlow and CPU kernels give
    the same bpc to the last digit (only the seconds vary with the machine and its load)."""
    import shutil

    import factories
    from factories import run_in_process

    (tmp_path / "prepared").mkdir()
    data = factories.random_bytes_data(tmp_path / "prepared", 8, 4)
    tables, evals = [], []
    for name in ("first", "second"):
        out = tmp_path / name
        shutil.copytree(data, out / "data")  # prepared: the demo reuses it
        result = run_in_process("tfxl.train.demo", f"--out={out}", "--train_steps=6",
                                "--batch_size=4", "--eval_tgt_len=8", "--eval_mem_lens=0,16")
        assert result.returncode == 0, result.stderr[-2000:]
        tables.append([line for line in result.stdout.splitlines() if line.startswith("|")])
        evals.append([(r["mem_len"], r["bpc"], r["tokens"]) for r in
                      json.loads((out / "results.json").read_text())["eval"]])
    assert len(tables[0]) == 5 and tables[0] == tables[1], tables
    assert evals[0] == evals[1]
