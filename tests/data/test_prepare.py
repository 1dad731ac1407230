"""tfxl-prepare: formats, record layout, manifest, bad input, atomicity."""

import json
import os
import signal
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest

from data_helpers import run_cli, run_prepare, sample_text, split_targets
from factories import run_in_process
from tfxl.data import records, sources, staging
from tfxl.data.errors import DataError
from tfxl.data.manifest import check_manifest, load_manifest
from tfxl.data.pipeline import verify_shards
from tfxl.data.prepare import suggest_cutoffs
from tfxl.data.tokenizers import load_tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def reconstruct(data_dir, manifest, split):
    """Concatenates every record's real targets in stream order -> the split's tokens."""
    pieces = []
    for ex in split_targets(data_dir, manifest, split):
        pieces.append(ex["tokens"][1:1 + ex["length"]])
    return np.concatenate(pieces)


# --------------------------------------------------------------------------- formats
def test_text_bytes_records_hold_every_token_once(tmp_path, write):
    text = sample_text(300, seed=3)
    train = write("train.txt", text)
    valid = write("valid.txt", text[:900])
    manifest = run_prepare(tmp_path / "out", train=[train], valid=[valid], tgt_len=16,
                           num_streams=4)
    out = str(tmp_path / "out")
    assert manifest == load_manifest(out)
    assert set(manifest["splits"]) == {"train", "valid"}
    for split, source in (("train", text), ("valid", text[:900])):
        expected = np.frombuffer(source.encode(), np.uint8)
        np.testing.assert_array_equal(reconstruct(out, manifest, split), expected)
        info = manifest["splits"][split]
        assert info["tokens"] == expected.size
        assert sum(s["tokens"] for s in info["streams"]) == expected.size
        assert len(info["streams"]) == 4
    # Record layout: stream s's records are positions 0..n-1, reset only at the start.
    records = split_targets(out, manifest, "valid")
    by_stream = {}
    for ex in records:
        by_stream.setdefault(int(ex["stream"]), []).append(ex)
    for s, exs in by_stream.items():
        assert [int(e["position"]) for e in exs] == list(range(len(exs)))
        assert [int(e["reset"]) for e in exs] == [1] + [0] * (len(exs) - 1)
        assert all(e["length"] == 16 for e in exs[:-1])
    assert manifest["tokenizer"]["type"] == "bytes" and manifest["vocab_size"] == 258
    assert manifest["tgt_len"] == 16 and manifest["num_streams"] == 4
    assert manifest["format_version"] == 1 and manifest["is_character_level"] is True
    # The manifest's record entry, as every prepared directory since format_version 1 has it.
    assert manifest["record"] == {
        "type": "tf.train.Example", "compression": None,
        "features": {"tokens": ["int64", [17]], "length": ["int64", []], "reset": ["int64", []],
                     "stream": ["int64", []], "position": ["int64", []]}}
    verify_shards(out, manifest["splits"]["train"]["streams"])


def test_enwik8_single_file_split_and_zip_equivalence(tmp_path, write):
    data = bytes(np.random.default_rng(0).integers(0, 256, 20_000, dtype=np.uint8))
    raw = write("enwik8", data)
    zipped = str(tmp_path / "enwik8.zip")
    with zipfile.ZipFile(zipped, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.write(raw, "enwik8")
    m_raw = run_prepare(tmp_path / "raw", train=[raw], format="enwik8", tgt_len=8, num_streams=4)
    m_zip = run_prepare(tmp_path / "zip", train=[zipped], format="enwik8", tgt_len=8,
                        num_streams=4)
    # The paper's split, scaled: last 5% test, previous 5% valid (5M each for enwik8).
    assert [m_raw["splits"][s]["tokens"] for s in ("train", "valid", "test")] == [18000, 1000, 1000]
    for split, (lo, hi) in {"train": (0, 18000), "valid": (18000, 19000),
                            "test": (19000, 20000)}.items():
        for out, m in ((tmp_path / "raw", m_raw), (tmp_path / "zip", m_zip)):
            np.testing.assert_array_equal(reconstruct(str(out), m, split),
                                          np.frombuffer(data[lo:hi], np.uint8))


def test_several_train_files_alone_split_as_their_concatenation_would(tmp_path, write):
    text = sample_text(600, seed=11)
    third = text.index("\n", len(text) // 3) + 1
    one = run_prepare(tmp_path / "one", train=[write("all.txt", text)], tgt_len=8,
                      num_streams=2)
    several = run_prepare(tmp_path / "several", tgt_len=8, num_streams=2,
                          train=[write("a.txt", text[:third]), write("b.txt", text[third:])])
    assert set(several["splits"]) == {"train", "valid", "test"}
    for split in ("train", "valid", "test"):
        np.testing.assert_array_equal(reconstruct(str(tmp_path / "several"), several, split),
                                      reconstruct(str(tmp_path / "one"), one, split))
    assert one["splits"]["valid"]["tokens"] > 0 and one["splits"]["test"]["tokens"] > 0


def test_a_format_that_does_not_cut_its_train_files_says_which_splits_are_missing(tmp_path,
                                                                                 write):
    from tfxl.data import prepare as prepare_lib
    train = write("wiki.train.tokens", sample_text(50, seed=2))
    notes = []
    config = prepare_lib.PrepareConfig(output_dir=str(tmp_path / "out"), train=[train],
                                       format="wikitext", tgt_len=8)
    manifest = prepare_lib.prepare(config, log=notes.append)
    assert set(manifest["splits"]) == {"train"}
    assert ("note: no valid or test split: --format=wikitext does not cut its --train files; "
            "tfxl-train evaluates on valid, tfxl-eval reads a split by name: add --valid=FILE "
            "and --test=FILE") in notes


def test_text8_chars_and_wikitext_words(tmp_path, write):
    letters = "".join(np.random.default_rng(1).choice(list("abcdefgh "), 8000))
    m8 = run_prepare(tmp_path / "t8", train=[write("text8", letters)], format="text8",
                     tgt_len=8, num_streams=2)
    tok = load_tokenizer(str(tmp_path / "t8"))
    assert m8["tokenizer"]["type"] == "chars" and tok.vocab_size == 3 + 9
    joined = "".join(tok.decode(reconstruct(str(tmp_path / "t8"), m8, s))
                     for s in ("train", "valid", "test"))
    assert joined == letters

    text = sample_text(400, seed=5)
    paths = {s: write(f"wiki.{s}.tokens", text) for s in ("train", "valid", "test")}
    mw = run_prepare(tmp_path / "wt", train=[paths["train"]], valid=[paths["valid"]],
                     test=[paths["test"]], format="wikitext", tgt_len=8, num_streams=2,
                     min_freq=2)
    words = load_tokenizer(str(tmp_path / "wt"))
    assert mw["tokenizer"]["type"] == "words" and not mw["is_character_level"]
    ids = reconstruct(str(tmp_path / "wt"), mw, "valid")
    np.testing.assert_array_equal(ids, words.encode(text))
    assert (ids == words.eos_id).sum() == text.count("\n")
    assert os.path.isfile(tmp_path / "wt" / mw["tokenizer"]["vocab_file"])


def test_suggested_cutoffs_follow_frequency():
    counts = np.array([1000] * 10 + [10] * 1000 + [1] * 5000)
    cutoffs = suggest_cutoffs(counts, frequency_ordered=True)
    assert cutoffs and cutoffs == sorted(cutoffs) and cutoffs[-1] < counts.size
    assert suggest_cutoffs(counts, frequency_ordered=False) == []


def test_lm1b_keeps_documents_and_shuffles_sentences(tmp_path, write):
    docs = [[f"doc{d} sentence {i} the cat" for i in range(40)] for d in range(3)]
    paths = [write(f"news.en-{d:05d}", "\n".join(lines) + "\n") for d, lines in enumerate(docs)]
    m = run_prepare(tmp_path / "lm", train=[str(tmp_path / "news.en-*")],
                    valid=[paths[0]], format="lm1b", tgt_len=8, num_streams=2, seed=3)
    info = m["splits"]["train"]
    assert info["documents"] == 3 and info["resets_inside"]
    tok = load_tokenizer(str(tmp_path / "lm"))
    records = split_targets(str(tmp_path / "lm"), m, "train")
    text = tok.decode(np.concatenate([r["tokens"][1:1 + r["length"]] for r in records]))
    lines = text.splitlines()
    assert sorted(lines) == sorted(l for d in docs for l in d)        # nothing lost
    assert lines != [l for d in docs for l in d]                      # shuffled
    # Each document's sentences stay together, and every document starts a
    # segment with reset=1 whose first input is <eod>.
    assert [int(l.split()[0][3:]) for l in lines] == sorted(int(l.split()[0][3:]) for l in lines)
    doc_starts = [r for r in records if r["tokens"][0] == tok.eod_id]
    assert len(doc_starts) == 3 and all(r["reset"] == 1 for r in doc_starts)


def test_python_stdlib_corpus_is_deterministic_and_capped(tmp_path):
    kwargs = dict(corpus="python_stdlib", tgt_len=16, num_streams=4, max_train_bytes=20_000,
                  max_eval_bytes=4_000)
    m1 = run_prepare(tmp_path / "a", **kwargs)
    m2 = run_prepare(tmp_path / "b", **kwargs)
    assert m1["splits"] == m2["splits"] and m1["tokenizer"]["type"] == "bytes"
    assert [m1["splits"][s]["tokens"] for s in ("train", "valid", "test")] == [20000, 4000, 4000]
    files = {s: set(m1["splits"][s]["input_files"]) for s in ("train", "valid", "test")}
    assert not (files["train"] & files["valid"]) and not (files["valid"] & files["test"])
    assert all(f.endswith(".py") and "site-packages" not in f for s in files.values() for f in s)
    all_files = sources.stdlib_files()
    shares = [sum(sources.stdlib_split_of(os.path.basename(f) + str(i)) == s
                  for i, f in enumerate(all_files)) / len(all_files) for s in ("train", "valid")]
    assert 0.85 < shares[0] < 0.95 and 0.02 < shares[1] < 0.08


def test_jsonl_one_document_per_line(tmp_path, write):
    texts = [f"document {d}: " + sample_text(8, seed=d) for d in range(6)]
    lines = [json.dumps({"text": t, "id": d}) for d, t in enumerate(texts)]
    train = write("train.jsonl", "\n".join(lines[:5]) + "\n\n")   # a blank line is skipped
    valid = write("valid.jsonl", lines[5] + "\n")
    m = run_prepare(tmp_path / "j", train=[train], valid=[valid], format="jsonl",
                    tokenizer="words", tgt_len=4, num_streams=2)
    info = m["splits"]["train"]
    assert m["source"]["documents"] == "file" and info["documents"] == 5 and info["resets_inside"]
    tok = load_tokenizer(str(tmp_path / "j"))
    recs = split_targets(str(tmp_path / "j"), m, "train")
    # Every document starts its own segment (reset, <eod> first), in order, nothing lost.
    starts = [i for i, r in enumerate(recs) if r["tokens"][0] == tok.eod_id]
    assert len(starts) == 5 and all(recs[i]["reset"] == 1 for i in starts)
    bounds = starts[1:] + [len(recs)]
    for d, (a, b) in enumerate(zip(starts, bounds)):
        ids = np.concatenate([r["tokens"][1:1 + r["length"]] for r in recs[a:b]])
        np.testing.assert_array_equal(ids, tok.encode(texts[d]))
    # --documents=none: one document, the texts one after the other, each newline-terminated.
    m = run_prepare(tmp_path / "b", train=[train], valid=[valid], format="jsonl",
                    documents="none", tgt_len=4, num_streams=2)
    assert m["tokenizer"]["type"] == "bytes" and m["splits"]["train"]["documents"] == 1
    np.testing.assert_array_equal(reconstruct(str(tmp_path / "b"), m, "train"),
                                  np.frombuffer("".join(texts[:5]).encode(), np.uint8))


def test_jsonl_single_file_split_cuts_between_records(tmp_path, write):
    texts = [f"record {i} " + "x" * (i % 7) for i in range(400)]
    src = write("all.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in texts))
    m = run_prepare(tmp_path / "out", train=[src], format="jsonl", tgt_len=4, num_streams=2)
    counts = [m["splits"][s]["documents"] for s in ("train", "valid", "test")]
    assert sum(counts) == 400 and counts[1] > 0 and counts[2] > 0
    joined = b"".join(reconstruct(str(tmp_path / "out"), m, s).astype(np.uint8).tobytes()
                      for s in ("train", "valid", "test"))
    assert joined.decode() == "".join(t + "\n" for t in texts)


@pytest.mark.parametrize("line, reason", [
    ('{"text": "fine"}\n{"text": 3}\n', 'line 2: expected a JSON object with a string "text"'),
    ('{"text": "fine"}\n["text"]\n', 'line 2: expected a JSON object'),
    ('{"txt": "typo"}\n', 'line 1: expected a JSON object with a string "text"'),
    ('{"text": "fine"}\n\n{"text": "cut\n', "line 3 is not valid JSON"),
])
def test_jsonl_bad_record_names_file_and_line(tmp_path, write, capsys, line, reason):
    src = write("bad.jsonl", line)
    out = tmp_path / "out"
    code, err = run_cli([f"--train={src}", f"--valid={src}", "--format=jsonl", "--tgt_len=2",
                         "--num_streams=1", f"--output_dir={out}"], capsys)
    errors = [e for e in err.splitlines() if e.startswith("error:")]
    assert code == 2 and errors == [f"error: {src}: {reason}" + errors[0].split(reason)[1]]
    assert not out.exists()


def test_sentencepiece_learned_from_the_training_split(tmp_path, write):
    text = sample_text(300, seed=4)
    train, valid = write("train.txt", text), write("valid.txt", text[:2000])
    m = run_prepare(tmp_path / "sp", train=[train], valid=[valid], tokenizer="sentencepiece",
                    sentencepiece_vocab_size=40, tgt_len=8, num_streams=2)
    out = tmp_path / "sp"
    assert m["tokenizer"]["type"] == "sentencepiece" and m["vocab_size"] == 40 + 3
    assert (out / "sentencepiece.model").is_file()
    assert not [e for e in os.listdir(out) if e.startswith(staging.TMP_PREFIX)]
    tok = load_tokenizer(str(out))   # the model's sha256 matches the manifest
    valid_ids = reconstruct(str(out), m, "valid")
    np.testing.assert_array_equal(valid_ids, tok.encode(text[:2000]))
    assert tok.decode(valid_ids) == "\n".join(" ".join(l.split()) for l in text[:2000].split("\n"))
    # The learned model is then an ordinary --sentencepiece_model.
    again = run_prepare(tmp_path / "again", train=[train], valid=[valid],
                        tokenizer="sentencepiece",
                        sentencepiece_model=str(out / "sentencepiece.model"),
                        tgt_len=8, num_streams=2)
    assert again["vocab_sha256"] == m["vocab_sha256"] and again["splits"] == m["splits"]


def test_sentencepiece_flags_and_missing_package(tmp_path, write, capsys, monkeypatch):
    src = write("a.txt", sample_text(200))
    out = tmp_path / "o"
    base = [f"--train={src}", f"--output_dir={out}", "--tgt_len=4", "--num_streams=2"]
    code, err = run_cli(base + ["--tokenizer=sentencepiece", "--sentencepiece_vocab_size=40",
                                f"--sentencepiece_model={src}"], capsys)
    assert code == 2 and "mutually exclusive" in err
    code, err = run_cli(base + ["--sentencepiece_vocab_size=40"], capsys)
    assert code == 2 and "need --tokenizer=sentencepiece" in err
    code, err = run_cli(base + ["--tokenizer=sentencepiece", "--sentencepiece_vocab_size=9999"],
                        capsys)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Vocabulary size too high" in errors[0]
    assert "Traceback" not in err
    monkeypatch.setitem(sys.modules, "sentencepiece", None)  # the extra is not installed
    code, err = run_cli(base + ["--tokenizer=sentencepiece", "--sentencepiece_vocab_size=40"],
                        capsys)
    assert code == 2 and err.splitlines()[-1] == (
        "error: --sentencepiece_vocab_size needs the sentencepiece package: "
        "pip install '.[sentencepiece]' in a clone of tfxl")
    assert not out.exists()


def test_progress_bars_only_on_a_terminal(tmp_path, write, capsys, monkeypatch):
    src = write("a.txt", sample_text(300))
    kwargs = dict(train=[src], valid=[src], tokenizer="words", tgt_len=8, num_streams=2)
    run_prepare(tmp_path / "quiet", progress=None, **kwargs)   # capsys' stdout is no terminal
    assert capsys.readouterr().out == ""
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    run_prepare(tmp_path / "shown", progress=None, **kwargs)
    shown = capsys.readouterr().out
    for label in ("train: reading for the words vocabulary", "train: tokenizing",
                  "train: writing 2 shards", "valid: tokenizing", "valid: writing 2 shards"):
        assert label in shown
    assert "━" in shown and "/kB" in shown and "/token" in shown  # Keras' bar with its rate


# --------------------------------------------------------------------------- bad input
def test_missing_and_unreadable_files(tmp_path, capsys):
    out = str(tmp_path / "out")
    code, err = run_cli([f"--train={tmp_path}/nope.txt", f"--output_dir={out}"], capsys)
    assert code == 2 and err.strip() == f"error: --train: file not found: {tmp_path}/nope.txt"
    code, err = run_cli([f"--train={tmp_path}/*.none", f"--output_dir={out}"], capsys)
    assert code == 2 and "no files match" in err
    # /proc/self/mem exists but reading it fails (EIO), even for root.
    code, err = run_cli(["--train=/proc/self/mem", f"--output_dir={out}"], capsys)
    assert code == 2 and "cannot read /proc/self/mem" in err
    assert not os.path.exists(out)


def test_empty_corpus_and_too_small_split(tmp_path, write, capsys):
    empty = write("empty.txt", "")
    out = str(tmp_path / "out")
    code, err = run_cli([f"--train={empty}", f"--output_dir={out}"], capsys)
    assert code == 2 and "split 'train' is empty" in err and empty in err
    small = write("small.txt", "x" * 100)
    code, err = run_cli([f"--train={small}", f"--valid={small}", "--tgt_len=16",
                         "--num_streams=8", f"--output_dir={out}"], capsys)
    assert code == 2 and "fewer than one segment per stream" in err
    assert "--num_streams=8" in err and "--tgt_len=16" in err
    assert not os.path.exists(out)


def test_invalid_utf8_names_file_and_offset(tmp_path, write, capsys):
    bad = write("bad.txt", b"good line\n" * 3 + b"caf\xe9 au lait\n" + b"more\n" * 50)
    out = str(tmp_path / "out")
    code, err = run_cli([f"--train={bad}", "--tokenizer=words", "--tgt_len=4",
                         "--num_streams=2", f"--output_dir={out}"], capsys)
    assert code == 2 and "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        f"error: {bad}: invalid UTF-8 at byte offset 33 (pass --errors=replace to "
        "substitute U+FFFD, or use --tokenizer=bytes)"]
    code, _ = run_cli([f"--train={bad}", "--tokenizer=chars", "--tgt_len=4",
                       "--num_streams=2", "--errors=replace", f"--output_dir={out}"], capsys)
    assert code == 0
    tok = load_tokenizer(out)
    assert "\ufffd" in tok.vocab
    # Bytes never care about UTF-8.
    code, _ = run_cli([f"--train={bad}", "--tgt_len=4", "--num_streams=2",
                       f"--output_dir={tmp_path / 'bytes'}"], capsys)
    assert code == 0


def test_non_empty_output_dir_is_refused_and_kept(tmp_path, write, capsys):
    src = write("a.txt", sample_text(100))
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.me").write_text("precious")
    code, err = run_cli([f"--train={src}", f"--output_dir={out}", "--tgt_len=8"], capsys)
    assert code == 2 and "is not empty; pass --overwrite" in err
    assert os.listdir(out) == ["keep.me"]


def test_overwrite_replaces_and_failed_overwrite_keeps_old_data(tmp_path, write, monkeypatch):
    out = tmp_path / "out"
    first = run_prepare(out, train=[write("a.txt", sample_text(200, seed=1))], tgt_len=8,
                        num_streams=4)
    with pytest.raises(DataError, match="not empty"):
        run_prepare(out, train=[write("b.txt", sample_text(200, seed=2))], tgt_len=8)
    # A prepare that fails half-way (here: while writing records) leaves the
    # previous data and its manifest untouched.
    calls = {"n": 0}
    original = records.encode

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 50:
            raise DataError("simulated failure while writing shards")
        return original(*args, **kwargs)

    monkeypatch.setattr(records, "encode", failing)
    with pytest.raises(DataError, match="simulated"):
        run_prepare(out, train=[write("b.txt", sample_text(200, seed=2))], tgt_len=8,
                    num_streams=2, overwrite=True)
    assert load_manifest(str(out)) == first
    verify_shards(str(out), first["splits"]["train"]["streams"])
    assert not [e for e in os.listdir(out) if e.startswith(staging.TMP_PREFIX)]
    monkeypatch.setattr(records, "encode", original)
    second = run_prepare(out, train=[write("b.txt", sample_text(200, seed=2))], tgt_len=8,
                         num_streams=2, overwrite=True)
    assert second["num_streams"] == 2
    # Shards of the old 4-stream layout are gone.
    assert sorted(f for f in os.listdir(out) if f.endswith(".tfrecord")) == sorted(
        s["file"] for split in second["splits"].values() for s in split["streams"])
    assert len(second["splits"]) == 3 and all(
        len(split["streams"]) == 2 for split in second["splits"].values())


def test_corrupt_and_truncated_shards_are_named(tmp_path, write):
    out = str(tmp_path / "out")
    manifest = run_prepare(out, train=[write("a.txt", sample_text(200))], tgt_len=8,
                           num_streams=2)
    streams = manifest["splits"]["train"]["streams"]
    shard = os.path.join(out, streams[1]["file"])
    data = bytearray(open(shard, "rb").read())
    data[len(data) // 2] ^= 0x40                    # same size, bad CRC
    open(shard, "wb").write(bytes(data))
    with pytest.raises(DataError, match=f"corrupt TFRecord shard {shard}"):
        verify_shards(out, streams)
    open(shard, "wb").write(bytes(data[:-10]))     # truncated
    with pytest.raises(DataError, match=f"shard {shard} is truncated"):
        verify_shards(out, streams, crc=False)
    os.remove(shard)
    with pytest.raises(DataError, match=f"shard {shard} is missing"):
        verify_shards(out, streams)


def test_manifest_errors_and_mismatches(tmp_path, write):
    with pytest.raises(DataError, match="does not exist"):
        load_manifest(str(tmp_path / "nowhere"))
    with pytest.raises(DataError, match="manifest.json not found"):
        load_manifest(str(tmp_path))
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(DataError, match="not valid JSON"):
        load_manifest(str(tmp_path))
    (tmp_path / "manifest.json").write_text(json.dumps({"format_version": 99}))
    with pytest.raises(DataError, match="format_version 99"):
        load_manifest(str(tmp_path))
    m = run_prepare(tmp_path / "out", train=[write("a.txt", sample_text(100))], tgt_len=8,
                    num_streams=4)
    check_manifest(m, tgt_len=8, num_streams=4, vocab_sha256=m["vocab_sha256"],
                   global_batch_size=2)
    with pytest.raises(ValueError, match=r"tgt_len mismatch: training uses tgt_len=16 "
                                         r"but the manifest has tgt_len=8"):
        check_manifest(m, tgt_len=16)
    with pytest.raises(ValueError, match="num_streams mismatch.*=8.*=4"):
        check_manifest(m, num_streams=8)
    with pytest.raises(ValueError, match="vocab_sha256 mismatch"):
        check_manifest(m, vocab_sha256="0" * 64)
    with pytest.raises(ValueError, match="global batch size 3 must divide num_streams=4"):
        check_manifest(m, global_batch_size=3)


# A prepared manifest, edited: (the edit, what the one-line refusal names). Every field a reader
# uses, of the top level, the tokenizer, a split and a stream: missing, of another type, out of
# range, or disagreeing with another field.
def _set(path, value):
    def edit(manifest):
        *parents, last = path
        for key in parents:
            manifest = manifest[key]
        manifest[last] = value
    return edit


def _drop(path):
    def edit(manifest):
        *parents, last = path
        for key in parents:
            manifest = manifest[key]
        del manifest[last]
    return edit


STREAM0 = ("splits", "train", "streams", 0)
BAD_MANIFESTS = {
    "num_streams a string": (_set(["num_streams"], "4"), "field 'num_streams' must be an integer"),
    "a stream entry {}": (_set(STREAM0, {}),
                          "missing field 'splits.train.streams[0].file'"),
    "a stream entry a list": (_set(STREAM0, []),
                              "field 'splits.train.streams[0]' must be an object"),
    "stream bytes a float": (_set(STREAM0 + ("bytes",), 1.5),
                             "field 'splits.train.streams[0].bytes' must be an integer"),
    "stream segments 0": (_set(STREAM0 + ("segments",), 0),
                          "field 'splits.train.streams[0].segments' must be >= 1, got 0"),
    "no pad_id": (_drop(["pad_id"]), "missing field 'pad_id'"),
    "tgt_len 0": (_set(["tgt_len"], 0), "field 'tgt_len' must be >= 1, got 0"),
    "vocab_size a bool": (_set(["vocab_size"], True), "field 'vocab_size' must be an integer"),
    "vocab_size 10**12, its tokenizer 258": (
        _set(["vocab_size"], 10**12),
        "field 'vocab_size' is 1000000000000 but its tokenizer (bytes) has 258 tokens"),
    "tokenizer without type": (_drop(["tokenizer", "type"]), "missing field 'tokenizer.type'"),
    "pad_id outside the vocabulary": (_set(["pad_id"], 258),
                                      "field 'pad_id' is 258, outside the vocabulary [0, 258)"),
    "cutoffs past vocab_size": (_set(["cutoffs"], [10, 300]), "field 'cutoffs' must increase"),
    "a split a list": (_set(["splits", "valid"], []), "field 'splits.valid' must be an object"),
    "a split without tokens": (_drop(["splits", "valid", "tokens"]),
                               "missing field 'splits.valid.tokens'"),
    "fewer streams than num_streams": (
        lambda m: m["splits"]["valid"]["streams"].pop(),
        "field 'splits.valid.streams' lists 1 streams, num_streams is 2"),
}


@pytest.mark.parametrize("case", BAD_MANIFESTS)
def test_a_bad_manifest_field_is_named_when_loaded(tmp_path, write, case):
    edit, named = BAD_MANIFESTS[case]
    out = tmp_path / "out"
    manifest = run_prepare(out, train=[write("a.txt", sample_text(100))],
                           valid=[write("b.txt", sample_text(50))], tgt_len=8, num_streams=2)
    assert load_manifest(str(out)) == manifest
    edit(manifest)
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError) as refused:
        load_manifest(str(out))
    message = str(refused.value)
    assert message.startswith(f"{out / 'manifest.json'}: ") and "\n" not in message
    assert named in message and message.endswith("re-run tfxl-prepare"), message


def test_bad_flags(tmp_path, write, capsys):
    src = write("a.txt", sample_text(50))
    code, err = run_cli([f"--train={src}", "--tokenizer=sentencepiece",
                         f"--output_dir={tmp_path / 'o'}"], capsys)
    assert code == 2 and "--sentencepiece_model" in err
    code, err = run_cli(["--corpus=python_stdlib", f"--train={src}",
                         f"--output_dir={tmp_path / 'o'}"], capsys)
    assert code == 2 and "mutually exclusive" in err
    code, err = run_cli([f"--train={src}"], capsys)
    assert code == 2 and "--output_dir is required" in err


# --------------------------------------------------------------------------- the real CLI
def _env():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.mark.large
@pytest.mark.subprocess
def test_cli_subprocess_error_line_and_unknown_flag(tmp_path):
    cmd = [sys.executable, "-m", "tfxl.data.prepare"]
    bad = subprocess.run(cmd + [f"--train={tmp_path}/missing.txt", f"--output_dir={tmp_path}/o"],
                         capture_output=True, text=True, env=_env(), timeout=120)
    assert bad.returncode == 2
    error_lines = [l for l in bad.stderr.splitlines() if l.startswith("error:")]
    assert error_lines == [f"error: --train: file not found: {tmp_path}/missing.txt"]
    assert "Traceback" not in bad.stderr
    # Flag parsing is the tool's run() whether a process or the test runs it: in this process
    # (test_faults_cli.py::test_usage_errors_exit_2_and_help_lists_the_tools_own_flags checks
    # every tool's unknown flag so too).
    unknown = run_in_process("tfxl.data.prepare", "--no_such_flag=1")
    assert unknown.returncode != 0 and "no_such_flag" in unknown.stderr


@pytest.mark.large
@pytest.mark.subprocess
def test_kill_during_prepare_leaves_no_manifest(tmp_path):
    src = tmp_path / "big.bin"
    src.write_bytes(np.random.default_rng(0).integers(0, 256, 6_000_000, dtype=np.uint8).tobytes())
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfxl.data.prepare", f"--train={src}", f"--output_dir={out}",
         "--tgt_len=8", "--num_streams=4"],
        env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Wait until shards are being written, then kill without warning.
        deadline = time.time() + 90
        while time.time() < deadline:
            tmp = [d for d in (os.listdir(out) if out.exists() else [])
                   if d.startswith(staging.TMP_PREFIX)]
            if tmp and any(f.endswith(".tfrecord") for f in os.listdir(out / tmp[0])):
                break
            assert proc.poll() is None, "prepare finished before it could be killed"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "manifest.json").exists()
    with pytest.raises(DataError, match="not found"):
        load_manifest(str(out))
    # The leftover temporary directory is not "data": a new prepare proceeds and cleans it.
    run_prepare(out, train=[str(src)], max_train_bytes=50_000, tgt_len=8, num_streams=4)
    assert not [e for e in os.listdir(out) if e.startswith(staging.TMP_PREFIX)]
    assert load_manifest(str(out))["splits"]["train"]["tokens"] == 50_000
