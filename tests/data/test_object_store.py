"""Paths on any TensorFlow file system, and the publication of an object-store --output_dir.

Without a network: TensorFlow's in-memory file system (``ram://``) is a real non-local file
system for the end-to-end runs, and the object-store publication (tfxl/data/staging.py,
`GenerationDirectory`) is also forced onto a local directory, where every write and removal can be
watched and a failure injected just before the manifest.
"""

import json
import os
import tempfile
import zipfile

import numpy as np
import pytest
import tensorflow as tf

from data_helpers import run_cli, run_prepare, sample_text
import tfxl.files
from tfxl.data import staging
from tfxl.data.errors import DataError
from tfxl.data.manifest import load_manifest
from tfxl.data.pipeline import InputParams, input_fn, verify_shards
from tfxl.data.tokenizers import load_tokenizer


def put(path, data):
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
    return path


def evaluated_tokens(data_dir, split):
    """Every real target input_fn yields for a split (a full evaluation pass)."""
    params = InputParams(data_dir=data_dir, batch_size=2)
    return sum(int(batch["target_mask"].numpy().sum()) for batch in input_fn(split, params))


@pytest.fixture
def ram(tmp_path, monkeypatch):
    """A fresh ram:// directory; the working directory is an empty local one, to show that
    nothing creates a local "ram:" folder. (ram:// lists by name prefix, unlike GCS: a directory
    "x" there also holds a sibling "x.zip". The tests keep inputs in in/ and outputs in out/, under
    names that are no prefix of one another.)"""
    root = f"ram://{tmp_path.name}"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    yield root
    assert os.listdir(cwd) == []
    if tf.io.gfile.exists(root):
        tf.io.gfile.rmtree(root)


def test_is_local():
    assert tfxl.files.is_local("/data/x") and tfxl.files.is_local("data") and tfxl.files.is_local(
        "file:///data/x")
    assert not any(tfxl.files.is_local(p) for p in ("gs://b/x", "s3://b/x", "ram://x", "hdfs://h/x"))


# ------------------------------------------------------------------ a non-local file system
def test_prepare_and_read_back_on_a_non_local_file_system(ram, tmp_path):
    text = sample_text(300, seed=5)
    put(f"{ram}/in/train-1.txt", text[:6000])
    put(f"{ram}/in/train-2.txt", text[6000:])
    put(f"{ram}/in/valid.txt", text[:2000])
    out = f"{ram}/out/words"
    manifest = run_prepare(out, train=[f"{ram}/in/train-*.txt"],
                           valid=[f"{ram}/in/valid.txt"], tokenizer="words", tgt_len=8,
                           num_streams=2)
    assert load_manifest(out) == manifest
    generation = manifest["tokenizer"]["vocab_file"].split("/")[0]
    assert generation.startswith("gen-")
    assert sorted(tf.io.gfile.listdir(out)) == sorted([generation, "manifest.json"])
    assert manifest["splits"]["train"]["input_files"] == [f"{ram}/in/train-1.txt",
                                                          f"{ram}/in/train-2.txt"]
    for split in ("train", "valid"):
        verify_shards(out, manifest["splits"][split]["streams"])
    assert evaluated_tokens(out, "valid") == manifest["splits"]["valid"]["tokens"]
    tokenizer = load_tokenizer(out)
    assert tokenizer.decode(tokenizer.encode("the cat sat")) == "the cat sat"
    # The same corpus prepared locally gives the same splits, shard for shard.
    local_dir = tmp_path / "local"
    (local_dir / "corpus").mkdir(parents=True)
    for name in ("train-1.txt", "train-2.txt", "valid.txt"):
        (local_dir / "corpus" / name).write_bytes(
            tfxl.files.read_bytes(f"{ram}/in/{name}"))
    local = run_prepare(local_dir / "out", train=[str(local_dir / "corpus" / "train-*.txt")],
                        valid=[str(local_dir / "corpus" / "valid.txt")], tokenizer="words",
                        tgt_len=8, num_streams=2)
    assert local["vocab_sha256"] == manifest["vocab_sha256"]
    for split in ("train", "valid"):
        ours, theirs = manifest["splits"][split]["streams"], local["splits"][split]["streams"]
        assert [s["file"] for s in ours] == [f"{generation}/{s['file']}" for s in theirs]
        assert [{**s, "file": None} for s in ours] == [{**s, "file": None} for s in theirs]
    # Refusals read the same as on a local disk.
    with pytest.raises(DataError, match="is not empty; pass --overwrite"):
        run_prepare(out, train=[f"{ram}/in/valid.txt"], tgt_len=8)
    with pytest.raises(DataError, match=f"--train: file not found: {ram}/in/nope.txt"):
        run_prepare(f"{ram}/out/never", train=[f"{ram}/in/nope.txt"])
    with pytest.raises(DataError, match="--train: no files match"):
        run_prepare(f"{ram}/out/never", train=[f"{ram}/in/*.none"])
    assert not tf.io.gfile.exists(f"{ram}/out/never")


def test_zip_archives_and_sentencepiece_models_on_a_non_local_file_system(ram, tmp_path):
    data = bytes(np.random.default_rng(0).integers(0, 256, 20_000, dtype=np.uint8))
    archive = tmp_path / "enwik8.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("enwik8", data)
    put(f"{ram}/in/enwik8.zip", archive.read_bytes())
    m = run_prepare(f"{ram}/out/enwik8", train=[f"{ram}/in/enwik8.zip"], format="enwik8", tgt_len=8,
                    num_streams=4)
    assert m["splits"]["train"]["input_files"] == [f"{ram}/in/enwik8.zip:enwik8"]
    assert [m["splits"][s]["tokens"] for s in ("train", "valid", "test")] == [18000, 1000, 1000]
    assert evaluated_tokens(f"{ram}/out/enwik8", "test") == 1000
    # A SentencePiece model learned into the bucket is then a ready --sentencepiece_model there.
    put(f"{ram}/in/words.txt", sample_text(300, seed=4))
    learned = run_prepare(f"{ram}/out/sp-learned", train=[f"{ram}/in/words.txt"],
                          tokenizer="sentencepiece", sentencepiece_vocab_size=40, tgt_len=8,
                          num_streams=2)
    model = f"{ram}/out/sp-learned/{learned['tokenizer']['model_file']}"
    again = run_prepare(f"{ram}/out/sp-given", train=[f"{ram}/in/words.txt"],
                        tokenizer="sentencepiece", sentencepiece_model=model, tgt_len=8,
                        num_streams=2)
    assert again["vocab_sha256"] == learned["vocab_sha256"]
    assert load_tokenizer(f"{ram}/out/sp-given").vocab_size == 43


def test_crlf_json_lines_split_the_same_on_every_file_system(ram, tmp_path):
    """Line reading keeps every byte (GFile's own readline drops '\\r', which would move the
    single-file split's cut points and read records twice)."""
    body = "".join(json.dumps({"text": f"record {i} " + "x" * (i % 7)}) + "\r\n"
                   for i in range(400))
    local_file = tmp_path / "all.jsonl"
    local_file.write_bytes(body.encode())
    local = run_prepare(tmp_path / "out", train=[str(local_file)], format="jsonl", tgt_len=4,
                        num_streams=2)
    remote = run_prepare(f"{ram}/out/jsonl", train=[put(f"{ram}/in/all.jsonl", body)],
                         format="jsonl", tgt_len=4, num_streams=2)
    for split in ("train", "valid", "test"):
        ours, theirs = remote["splits"][split], local["splits"][split]
        assert (ours["documents"], ours["tokens"]) == (theirs["documents"], theirs["tokens"])
    assert sum(remote["splits"][s]["documents"] for s in ("train", "valid", "test")) == 400


def test_the_command_line_and_the_trainers_data_dir_take_non_local_paths(ram, capsys):
    put(f"{ram}/in/a.txt", sample_text(200))
    out = f"{ram}/out/cli"
    code, err = run_cli([f"--train={ram}/in/a.txt", f"--output_dir={out}", "--tgt_len=8",
                         "--num_streams=2"], capsys)
    assert code == 0, err
    assert load_manifest(out)["num_streams"] == 2   # what tfxl-train --data_dir reads first
    with pytest.raises(DataError, match="does not exist; run tfxl-prepare"):
        load_manifest(f"{ram}/out/nowhere")


# --------------------------------------------------------------------------- the publication
class WriteLog:
    """Records, in order, every file written (when its writer closes), renamed or removed through
    tf.io.gfile and TFRecordWriter."""

    def __init__(self, monkeypatch):
        self.events = []
        events, real_gfile, real_writer = self.events, tf.io.gfile.GFile, tf.io.TFRecordWriter

        class GFile(real_gfile):
            def __init__(self, name, mode="r", *args, **kwargs):
                super().__init__(name, mode, *args, **kwargs)
                self._logged = None if "r" in mode else name

            def close(self):
                super().close()
                if self._logged:
                    events.append(("write", self._logged))
                    self._logged = None

        class Writer:
            def __init__(self, path, *args, **kwargs):
                self.path, self.inner = path, real_writer(path, *args, **kwargs)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.inner.close()
                events.append(("write", self.path))

            def write(self, record):
                self.inner.write(record)

        def logged(kind, real):
            def call(path, *args, **kwargs):
                events.append((kind, path))
                return real(path, *args, **kwargs)
            return call

        monkeypatch.setattr(tf.io.gfile, "GFile", GFile)
        monkeypatch.setattr(tf.io, "TFRecordWriter", Writer)
        for name in ("rename", "remove", "rmtree"):
            monkeypatch.setattr(tf.io.gfile, name, logged(name, getattr(tf.io.gfile, name)))

    def writes(self):
        return [path for kind, path in self.events if kind == "write"]


@pytest.fixture
def object_store(monkeypatch, tmp_path):
    """Treats every path as an object store's (the local disk standing in for a bucket); the
    token scratch files go to tmp_path/scratch."""
    monkeypatch.setattr(tfxl.files, "is_local", lambda path: False)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    return scratch


def listed(manifest):
    return set(staging.manifest_files(manifest))


def generation_of(manifest):
    (generation,) = {name.split("/")[0] for name in listed(manifest)}
    return generation


def assert_readable(out, manifest):
    assert load_manifest(str(out)) == manifest
    for split, info in manifest["splits"].items():
        verify_shards(str(out), info["streams"])
    assert evaluated_tokens(str(out), "valid") == manifest["splits"]["valid"]["tokens"]
    load_tokenizer(str(out))


def test_object_store_manifest_is_the_last_write_and_old_files_go_after_it(
        tmp_path, write, monkeypatch, object_store):
    out = tmp_path / "out"
    kwargs = dict(valid=[write("v.txt", sample_text(60, seed=3))], tokenizer="words", tgt_len=8)
    first = run_prepare(out, train=[write("a.txt", sample_text(200, seed=1))], num_streams=4,
                        **kwargs)
    assert sorted(os.listdir(out)) == sorted([generation_of(first), "manifest.json"])
    log = WriteLog(monkeypatch)
    second = run_prepare(out, train=[write("b.txt", sample_text(200, seed=2))], num_streams=2,
                         overwrite=True, **kwargs)
    manifest_path = str(out / "manifest.json")
    writes = log.writes()
    # The manifest is written once, last; before it every file it lists and nothing else.
    assert writes[-1] == manifest_path and writes.count(manifest_path) == 1
    assert {os.path.relpath(path, out) for path in writes[:-1]} == listed(second)
    new = generation_of(second)
    assert new != generation_of(first) and listed(second).isdisjoint(listed(first))
    # Nothing renamed (no atomic rename on an object store); removals only after the manifest.
    published = log.events.index(("write", manifest_path))
    assert not [e for e in log.events if e[0] == "rename"]
    removals = [i for i, (kind, path) in enumerate(log.events)
                if kind in ("remove", "rmtree") and path.startswith(f"{out}/")]
    assert removals and min(removals) > published
    assert sorted(os.listdir(out)) == sorted([new, "manifest.json"])
    assert_readable(out, second)
    assert os.listdir(object_store) == []   # the token scratch files are gone too


def test_object_store_failure_before_the_manifest_keeps_the_old_data(
        tmp_path, write, monkeypatch, object_store):
    out = tmp_path / "out"
    kwargs = dict(valid=[write("v.txt", sample_text(60, seed=3))], tokenizer="words", tgt_len=8)
    first = run_prepare(out, train=[write("a.txt", sample_text(200, seed=1))], num_streams=4,
                        **kwargs)
    old = generation_of(first)
    real_write_manifest = staging._write_manifest

    def quota_exceeded(path, manifest):  # every shard and the vocabulary are written by now
        raise tf.errors.ResourceExhaustedError(None, None, "quota exceeded")

    monkeypatch.setattr(staging, "_write_manifest", quota_exceeded)
    again = dict(train=[write("b.txt", sample_text(200, seed=2))], num_streams=2, overwrite=True,
                 **kwargs)
    # A failing run removes what it wrote; the old data is untouched.
    with pytest.raises(DataError, match=f"cannot write into --output_dir {out}: quota exceeded"):
        run_prepare(out, **again)
    assert sorted(os.listdir(out)) == sorted([old, "manifest.json"])
    assert_readable(out, first)
    # A killed one (no clean-up at all) leaves its generation behind, named by no manifest.
    monkeypatch.setattr(staging.GenerationDirectory, "discard", lambda self: None)
    with pytest.raises(DataError, match="quota exceeded"):
        run_prepare(out, **again)
    (leftover,) = set(os.listdir(out)) - {old, "manifest.json"}
    assert leftover.startswith("gen-") and any(
        name.endswith(".tfrecord") for name in os.listdir(out / leftover))
    assert_readable(out, first)
    # The next run publishes and removes both the old data and the leftover.
    monkeypatch.setattr(staging, "_write_manifest", real_write_manifest)
    second = run_prepare(out, **again)
    assert sorted(os.listdir(out)) == sorted([generation_of(second), "manifest.json"])
    assert_readable(out, second)


def test_object_store_killed_first_prepare_leaves_no_manifest_and_is_cleaned_up(
        tmp_path, write, monkeypatch, object_store):
    out = tmp_path / "new"
    kwargs = dict(train=[write("a.txt", sample_text(200, seed=1))],
                  valid=[write("v.txt", sample_text(60, seed=3))], tgt_len=8, num_streams=2)

    def killed(path, manifest):
        raise KeyboardInterrupt  # stands in for kill -9, with discard() disabled below

    monkeypatch.setattr(staging, "_write_manifest", killed)
    monkeypatch.setattr(staging.GenerationDirectory, "discard", lambda self: None)
    with pytest.raises(KeyboardInterrupt):
        run_prepare(out, **kwargs)
    (leftover,) = os.listdir(out)
    with pytest.raises(DataError, match="manifest.json not found"):
        load_manifest(str(out))
    monkeypatch.undo()
    monkeypatch.setattr(tfxl.files, "is_local", lambda path: False)
    # A leftover is not data: no --overwrite needed, and it is removed.
    manifest = run_prepare(out, **kwargs)
    assert sorted(os.listdir(out)) == sorted([generation_of(manifest), "manifest.json"])
    assert leftover != generation_of(manifest)
    assert_readable(out, manifest)


def test_a_user_folder_named_like_a_generation_is_not_a_leftover(tmp_path, write, object_store):
    out = tmp_path / "out"
    (out / "gen-mine").mkdir(parents=True)
    src = write("a.txt", sample_text(100))
    with pytest.raises(DataError, match="is not empty"):
        run_prepare(out, train=[src], tgt_len=8)
    assert os.listdir(out) == ["gen-mine"]
