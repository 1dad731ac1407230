"""Progress where the user looks: a Keras bar on a terminal (tfxl-eval's too, though stderr is
the native-log filter's pipe), one plain line per host loop in a log or a pipe."""

import json
import os
import pty
import subprocess
import sys
import threading

import numpy as np
import pytest

from factories import console_script, random_bytes_data, run_in_process
from tfxl.train.loop.controller import ProgressBar, ProgressLines
from tfxl.train.loop.run import run_progress

CONTROL = ("\r", "\b", "\x1b")  # what a bar writes and a log must not hold
# As a user runs the tools: TF_CPP_MIN_LOG_LEVEL unset (tests/conftest.py sets one).
ENV = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}


def loop_outputs(step, steps=2):
    return {"step": step, "loss": np.full([steps], 2.0, np.float32), "seconds": 0.5}


def reading(fd, into):
    """Starts a thread that reads a pty's master end into `into` until its writers are gone."""
    def read():
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:  # EIO: every writer closed its end
                return
            if not chunk:
                return
            into.append(chunk)
    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def test_a_run_shows_a_bar_on_a_terminal_and_plain_lines_in_a_log(monkeypatch, tmp_path):
    master, slave = pty.openpty()
    shown = []
    thread = reading(master, shown)
    with open(slave, "w", closefd=True) as terminal:
        monkeypatch.setattr(sys, "stdout", terminal)
        bar = run_progress(6, 0, "bpc", units_per_step=64)
        bar(loop_outputs(2))
        bar(loop_outputs(6))
        terminal.flush()
    thread.join(10)
    os.close(master)
    assert isinstance(bar, ProgressBar)
    assert any(c in b"".join(shown).decode() for c in "\r\b"), shown

    with open(tmp_path / "log", "w") as log:
        monkeypatch.setattr(sys, "stdout", log)
        lines = run_progress(6, 0, "bpc", units_per_step=64)
        lines(loop_outputs(2))
        lines(loop_outputs(6))
    assert isinstance(lines, ProgressLines)
    assert (tmp_path / "log").read_text().splitlines() == [
        "step 2/6: loss 2.0000, bpc 2.8854, 256 tokens/s",
        "step 6/6: loss 2.0000, bpc 2.8854, 256 tokens/s"]


@pytest.mark.large
@pytest.mark.subprocess
def test_tfxl_train_logs_plain_lines_and_tfxl_eval_shows_its_bar_on_a_terminal(tmp_path):
    data = random_bytes_data(tmp_path, tgt_len=8, num_streams=2, train_bytes=4000)
    model_dir = tmp_path / "model"
    # `make demo > log`: tfxl-train's stdout is no terminal (in this process, a StringIO: what
    # it prints there is the tool's choice, so no process is needed).
    trained = run_in_process(
        "tfxl.train.main", f"--data_dir={data}", f"--model_dir={model_dir}", "--n_layer=1",
        "--d_model=8", "--n_head=2", "--d_head=4", "--d_inner=8", "--tgt_len=8", "--mem_len=8",
        "--train_batch_size=2", "--train_steps=4", "--steps_per_loop=2")
    assert trained.returncode == 0, trained.stderr[-3000:]
    out = trained.stdout
    assert not [c for c in CONTROL if c in out], out[-2000:]
    # One line per host loop; --short_first_loops: the first ends at step 1.
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("step ")] == [
        "step 1/4", "step 2/4", "step 4/4"], out
    # Before the first step, which compiles: what is under way, not silence.
    assert ("step 0: compiling the train step, then running the first host loop (1 step)"
            in trained.stderr.splitlines()), trained.stderr[-3000:]

    master, slave = pty.openpty()
    shown = []
    thread = reading(master, shown)
    evaluated = subprocess.run(
        [console_script("tfxl-eval"), f"--data_dir={data}", f"--model_dir={model_dir}",
         "--max_eval_batches=3", "--loss_by_position"], stdout=subprocess.PIPE, stderr=slave,
        text=True, env=ENV,
        timeout=300)
    os.close(slave)
    thread.join(30)
    os.close(master)
    terminal = b"".join(shown).decode(errors="replace")
    assert evaluated.returncode == 0, terminal[-3000:]
    assert "evaluating valid: 3 steps" in terminal and "3/3" in terminal, terminal
    assert "0000 00:00:" not in terminal, terminal  # the filter still hides TensorFlow's lines
    result = json.loads(evaluated.stdout)
    assert len(result["loss_by_position"]) == result["tgt_len"] == 32  # the preset's eval_tgt_len
    assert np.mean(result["loss_by_position"]) == pytest.approx(result["loss"], rel=1e-5)
