"""tfxl-prepare and the data readers on gs://, against a real GCS API (the `gcs` fixture,
tests/gcs_emulator.py): TensorFlow's own GCS client, run as a user runs the tools.

Each run is the tool's `run()` in one worker process inside the emulator's namespace (the
`gcs_worker` fixture, factories.GcsWorker: one TensorFlow start), but for the prepare killed
with -9, a process of its own; the test process checks the bucket past TensorFlow (`gcs.list`,
`gcs.read`).
"""

import json
import os
import signal
import sys
import time

import numpy as np
import pytest

from data_helpers import sample_text
from tfxl.data.staging import manifest_files

pytestmark = pytest.mark.large

PREPARE = [sys.executable, "-m", "tfxl.data.prepare"]
# What tfxl-train and tfxl-eval read of a data directory: the manifest, every token of a split
# through input_fn, and the tokenizer.
READ_BACK = """
import json
from tfxl.data.manifest import load_manifest
from tfxl.data.pipeline import InputParams, input_fn
from tfxl.data.tokenizers import load_tokenizer
data_dir = {data_dir!r}
manifest = load_manifest(data_dir)
tokens = sum(int(b["target_mask"].numpy().sum())
             for b in input_fn("valid", InputParams(data_dir=data_dir, batch_size=2)))
tokenizer = load_tokenizer(data_dir)
print(json.dumps({{"manifest": manifest, "valid_tokens": tokens,
                   "decoded": tokenizer.decode(tokenizer.encode("the cat sat"))}}))
"""


def generations(names, prefix):
    return sorted({name[len(prefix):].split("/")[0] for name in names
                   if name[len(prefix):].startswith("gen-")})


def run_ok(gcs_worker, argv, cwd):
    done = gcs_worker.tool("tfxl.data.prepare", *argv, cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.subprocess
def test_prepare_on_gcs_publishes_manifest_last_and_readers_read_it(gcs, gcs_worker, tmp_path):
    root = f"data-{tmp_path.name}"
    text = sample_text(300, seed=5)
    gcs.write(f"{root}/in/train.txt", text)
    gcs.write(f"{root}/in/valid.txt", text[:2000])
    out, prefix = gcs.url(f"{root}/out"), f"{root}/out/"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    flags = [f"--train={gcs.url(root)}/in/train*.txt", f"--valid={gcs.url(root)}/in/valid.txt",
             f"--output_dir={out}", "--tokenizer=words", "--tgt_len=8"]
    run_ok(gcs_worker, [*flags, "--num_streams=4"], cwd)
    first = json.loads(gcs.read(f"{prefix}manifest.json"))
    names = gcs.list(prefix)
    (old,) = generations(names, prefix)
    assert all(f"{prefix}{name}" in names for name in manifest_files(first))
    # (an object whose name ends with "/" is a directory marker tf.io.gfile.makedirs writes)
    assert all(name.startswith(f"{prefix}{old}/") for name in names
               if name not in (f"{prefix}manifest.json", prefix)), names
    read_back = gcs_worker.python(READ_BACK.format(data_dir=out), cwd=cwd)
    assert read_back.returncode == 0, read_back.stderr[-3000:]
    read = json.loads(read_back.stdout.splitlines()[-1])
    assert read["manifest"] == first and read["decoded"] == "the cat sat"
    assert read["valid_tokens"] == first["splits"]["valid"]["tokens"]
    # Refused without --overwrite; with it, the old generation goes once the new manifest is in.
    refused = gcs_worker.tool("tfxl.data.prepare", *flags, "--num_streams=2", cwd=cwd)
    assert refused.returncode == 2 and "is not empty; pass --overwrite" in refused.stderr
    run_ok(gcs_worker, [*flags, "--num_streams=2", "--overwrite"], cwd)
    second = json.loads(gcs.read(f"{prefix}manifest.json"))
    names = gcs.list(prefix)
    (new,) = generations(names, prefix)
    assert new != old and second["num_streams"] == 2
    assert sorted(n for n in names if not n.endswith("/")) == sorted(
        [f"{prefix}manifest.json"] + [f"{prefix}{name}" for name in manifest_files(second)])
    assert os.listdir(cwd) == []   # no local "gs:" tree


@pytest.mark.subprocess
def test_prepare_killed_on_gcs_leaves_the_old_data_and_the_next_run_cleans_up(gcs, gcs_worker,
                                                                               tmp_path):
    root = f"data-{tmp_path.name}"
    gcs.write(f"{root}/in/small.txt", sample_text(200, seed=1))
    gcs.write(f"{root}/in/big.bin", np.random.default_rng(0).integers(
        0, 256, 6_000_000, dtype=np.uint8).tobytes())
    out, prefix = gcs.url(f"{root}/out"), f"{root}/out/"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    common = [f"--output_dir={out}", "--tgt_len=8", "--num_streams=4"]
    run_ok(gcs_worker, [f"--train={gcs.url(root)}/in/small.txt", *common], cwd)
    manifest = gcs.read(f"{prefix}manifest.json")
    old_objects = {name: gcs.read(name) for name in gcs.list(prefix)}
    (old,) = generations(old_objects, prefix)
    scratch = tmp_path / "scratch"   # TMPDIR: the token scratch files of a bucket's prepare
    scratch.mkdir()
    proc = gcs.popen([*PREPARE, f"--train={gcs.url(root)}/in/big.bin", *common, "--overwrite"],
                     cwd=cwd, stdout=None, stderr=None, env={"TMPDIR": str(scratch)})
    try:
        # Kill it without warning once the new generation has shards in the bucket.
        deadline = time.time() + 240
        while time.time() < deadline:
            names = gcs.list(prefix)
            if any(name.endswith(".tfrecord") and not name.startswith(f"{prefix}{old}/")
                   for name in names):
                break
            assert proc.poll() is None, "prepare finished before it could be killed"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    # The old manifest and every object of the old data, byte for byte; the new generation is
    # named by no manifest.
    names = gcs.list(prefix)
    assert {name: gcs.read(name) for name in old_objects} == old_objects
    (leftover,) = set(generations(names, prefix)) - {old}
    assert gcs.read(f"{prefix}manifest.json") == manifest
    # A kill leaves its local scratch directory too (no later run can tell it from a running one).
    assert len([p for p in scratch.iterdir() if p.name.startswith("tfxl-prepare-")]) == 1
    # The next run removes the leftover with the old data once its own manifest is in.
    run_ok(gcs_worker, [f"--train={gcs.url(root)}/in/small.txt", *common, "--tgt_len=4",
                    "--overwrite"], cwd)
    names = gcs.list(prefix)
    (new,) = generations(names, prefix)
    assert new not in (old, leftover)
    assert json.loads(gcs.read(f"{prefix}manifest.json"))["tgt_len"] == 4
