"""benchmarks/accelerator_bench.py, the harness that measures tfxl on an accelerator, kept
working by CI: its smoke path runs under JAX in a process where TensorFlow cannot
be imported, as on the GPU machine (JAX and PyTorch, no TensorFlow), and measures every phase.

Runs in the JAX pass (marked large, so `make test-large` runs it); the
TensorFlow and PyTorch passes skip it (the child process is the same in each).
"""

import json
import math
import os
import subprocess
import sys

import keras
import pytest

from backends import WITHOUT_TENSORFLOW

pytestmark = [pytest.mark.every_backend, pytest.mark.large, pytest.mark.subprocess]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(keras.backend.backend() != "jax",
                    reason="runs once, in the JAX pass")
def test_the_smoke_run_measures_training_evaluation_and_generation_without_tensorflow(tmp_path):
    """The wt103-shaped smoke model (tail clusters) in bf16 mixed precision: tfxl-train's
    training step (`JaxTrainStep.train`), the key/value evaluation step and
    `TransfoXLLM.generate` each give a positive rate, the loss is finite, no measuring process
    imported TensorFlow, and the Markdown table is printed. (The PyTorch peer is not part of
    CI's install: --peer off.)"""
    # A sitecustomize on the children's PYTHONPATH: every process the harness starts inherits it.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(WITHOUT_TENSORFLOW)
    out = tmp_path / "results.json"
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([str(site), REPO, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.accelerator_bench", "--smoke", "--presets=wt103_base",
         "--dtypes=bf16", "--peer=off", f"--out={out}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["smoke"] and not result["errors"]
    rows = {(r["phase"], r["dtype"]): r for r in result["rows"]}
    assert set(rows) == {("matmul_peak", "bf16"), ("matmul_peak", "fp32"), ("train", "bf16"),
                         ("eval", "bf16"), ("generate", "bf16")}, sorted(rows)
    assert not [r for r in result["rows"] if r["tensorflow_loaded"]]
    assert all(r["framework"] == "tfxl" and r["preset"] == "wt103_base"
               for r in result["rows"])
    train, evaluate = rows["train", "bf16"], rows["eval", "bf16"]
    generate = rows["generate", "bf16"]
    assert rows["matmul_peak", "fp32"]["flop_per_s"] > 0
    assert train["tokens_per_s"] > 0 and train["flop_per_s"] > 0
    assert math.isfinite(train["final_loss"]) and 0 < train["final_loss"] < 20
    assert (train["batch"], train["tgt_len"], train["mem_len"]) == (4, 16, 16)
    assert train["path"].startswith("tfxl-train's JaxTrainStep.train")
    assert train["steps_per_loop"] == 2 and train["warmup_steps"] == 2
    assert evaluate["tokens_per_s"] > 0
    assert (evaluate["tgt_len"], evaluate["mem_len"], evaluate["same_length"]) == (8, 32, True)
    assert generate["batch"] == 1 and generate["mem_len"] == 32
    assert all(t > 0 for t in generate["one_token_s"] + generate["many_tokens_s"])
    assert "SMOKE RUN" in done.stdout
    assert "| wt103_base | training, tokens/s | 4 | 16 / 16 | bf16 |" in done.stdout
