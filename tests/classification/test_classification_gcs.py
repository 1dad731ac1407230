"""The classification workflow with every path in a bucket (tests/gcs_emulator.py's real GCS
API): labelled JSON lines -> tfxl-prepare-classification -> tfxl-classify-train (with a
flagfile in the bucket) -> tfxl-classify-eval --output -> tfxl-export -> classify_text.

The session's process in the emulator's namespace (the `gcs_worker` fixture) runs the five tools
one after another through their own `run()` (tests/factories.py::run_in_process): no TensorFlow
start of their own."""

import json
import os

import pytest

pytestmark = [pytest.mark.large, pytest.mark.subprocess]

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKBONE = dict(n_layer=1, d_model=16, n_head=2, d_head=8, d_inner=32, tgt_len=8, mem_len=8,
                dropout=0.0, dropatt=0.0)


def labelled(count):
    """Label x: documents of "a" runs, y: of "b" runs (9 to 40 bytes: several segments)."""
    for i in range(count):
        label = "xy"[i % 2]
        yield json.dumps({"text": ("ab"[i % 2] * (3 + i % 5) + " ") * (3 + i % 6),
                          "label": label}) + "\n"


def test_the_classification_workflow_runs_with_every_path_on_gs(gcs, gcs_worker, tmp_path):
    url = gcs.url
    gcs.write("cls/train.jsonl", "".join(labelled(16)))
    gcs.write("cls/valid.jsonl", "".join(labelled(6)))
    gcs.write("cls/backbone.json", json.dumps(BACKBONE))
    gcs.write("cls/run.flags", "\n".join([
        f"--data_dir={url('cls/data')}", f"--model_dir={url('cls/run')}",
        f"--config={url('cls/backbone.json')}", "--train_steps=4", "--steps_per_loop=2",
        "--train_batch_size=4", "--eval_every=4", "--lease_settle=0", "--train_log_seconds=0",
        "--pooling=segment_attention", "--grad_segments=2"]) + "\n")
    code = f"""
import json, sys
sys.path.insert(0, {TESTS!r})
from factories import run_in_process

def tool(module, *args):
    done = run_in_process(module, *args)
    assert done.returncode == 0, (module, done.stdout[-2000:], done.stderr[-3000:])
    return done

tool("tfxl.data.prepare_classification", "--train={url('cls/train.jsonl')}",
     "--valid={url('cls/valid.jsonl')}", "--test={url('cls/valid.jsonl')}",
     "--output_dir={url('cls/data')}")
tool("tfxl.train.classify_main", "--flagfile={url('cls/run.flags')}")
tool("tfxl.classification.evaluate_main", "--model={url('cls/run/classifier.keras')}",
     "--data_dir={url('cls/data')}", "--split=test", "--output={url('cls/test.json')}")
tool("tfxl.serving.export_main", "--model={url('cls/run/classifier.keras')}",
     "--data_dir={url('cls/data')}", "--output_dir={url('cls/exports')}")
import tensorflow as tf
served = tf.saved_model.load("{url('cls/exports/1')}").signatures["classify_text"]
out = served(text=tf.constant(["aaa aaa aaa", "bbbb bbbb"]))
print("SERVED", json.dumps([label.decode() for label in out["labels"].numpy().tolist()]))
"""
    done = gcs_worker.python(code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    served = json.loads(done.stdout.split("SERVED ", 1)[1].splitlines()[0])
    assert len(served) == 2 and set(served) <= {"x", "y"}
    # Each tool's results landed in the bucket, published as the local ones are.
    assert "cls/data/manifest.json" in gcs.list("cls/data/")
    listed = gcs.list("cls/run/")
    for name in ("cls/run/classifier.keras", "cls/run/metrics.json", "cls/run/run.json"):
        assert name in listed, listed
    assert any(name.startswith("cls/run/checkpoints/ckpt-4") for name in listed), listed
    result = json.loads(gcs.read("cls/test.json"))
    assert result["documents"] == 6 and result["labels"] == ["x", "y"], result
    assert sum(map(sum, result["confusion"])) == 6, result
    assert "cls/exports/1/saved_model.pb" in gcs.list("cls/exports/")
