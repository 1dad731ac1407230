"""--help of the tools: the usage examples as written, the tool's own flags in groups under
headings, no internals before the example, no path of the virtualenv's script."""

import importlib
import re
import subprocess

import pytest
from absl import flags

from factories import console_script
from tfxl.cli import TOOLS
from tfxl.cli.tool_help import tool_help


@pytest.mark.parametrize("module", sorted(TOOLS.values()))
def test_usage_examples_keep_their_backslash_continued_lines(module):
    text = tool_help(importlib.import_module(module).__doc__, flags.FlagValues(), [])
    lines = text.splitlines()
    # Joined lines show as a flag after a run of spaces inside a line.
    assert not [line for line in lines if re.search(r"\S {3,}--", line)], text
    for line, after in zip(lines, lines[1:]):
        if line.endswith("\\"):
            assert after.startswith(" " * 8) and after.strip().startswith("--"), (line, after)


def test_prepare_help_opens_with_an_example():
    doc = importlib.import_module("tfxl.data.prepare").__doc__
    first = tool_help(doc, flags.FlagValues(), []).splitlines()[:4]
    assert first[0].startswith("`tfxl-prepare`:") and any(
        line.strip().startswith("tfxl-prepare --") for line in first), first


@pytest.mark.large
@pytest.mark.subprocess
def test_tfxl_train_help_groups_its_flags_under_headings():
    shown = subprocess.run([console_script("tfxl-train"), "--help"], capture_output=True,
                           text=True, timeout=300)
    assert shown.returncode == 0 and shown.stderr == "", shown.stderr[-2000:]
    out = shown.stdout
    assert "/bin/tfxl-train" not in out and "tfxl.train.main:" not in out
    headings = [line for line in out.splitlines() if re.match(r"^\S.*:$", line)]
    assert [h.split(" (")[0].rstrip(":") for h in headings] == [
        "data and model_dir", "model", "training", "evaluation", "checkpoints and warm start",
        "devices", "run management"], headings
    sections = dict(re.findall(r"(?ms)^(\S[^\n]*):\n(.*?)(?:\n\n|\Z)", out))
    named = {title.split(" (")[0]: re.findall(r"^  --(?:\[no\])?(\w+):", body, re.M)
             for title, body in sections.items()}
    assert {"n_layer", "cutoffs", "preset"} <= set(named["model"])
    assert {"learning_rate", "train_steps", "optimizer"} <= set(named["training"])
    assert {"eval_every", "eval_mem_len"} <= set(named["evaluation"])
    assert {"strategy"} <= set(named["devices"]) and "take_over" in named["run management"]
    everything = [name for names in named.values() for name in names]
    assert len(everything) == len(set(everything)) and len(everything) > 50


# What a tool's --help may load: its flags and docstring, no TensorFlow or Keras (12-20 s on 2
# cores). Each tool runs `--help` in a fresh interpreter, which reports its sys.modules on exit.
HELP_LOADS = """
import atexit, contextlib, importlib, io, os, sys
module = sys.argv[1]
sys.argv = [module, "--help"]
atexit.register(lambda: os.write(1, " ".join(
    name for name in ("tensorflow", "keras", "jax", "torch") if name in sys.modules).encode()))
with contextlib.redirect_stdout(io.StringIO()) as shown:
    try:
        importlib.import_module(module).run()
    except SystemExit:
        pass
assert "--" in shown.getvalue(), shown.getvalue()
"""


# Every tool: its modules, and those its flags come from, import TensorFlow and Keras in the
# functions that use them (or through `tfxl.deferred`), never at their top.
@pytest.mark.large
@pytest.mark.subprocess
@pytest.mark.parametrize("module", sorted(TOOLS.values()))
def test_help_loads_no_tensorflow(module):
    import sys

    result = subprocess.run([sys.executable, "-c", HELP_LOADS, module], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == "", f"{module} --help loaded {result.stdout}"
