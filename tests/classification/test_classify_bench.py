"""The stdlib classification task (tfxl.data.stdlib_classification), the benchmark's long-range
probe (benchmarks/classify_experiment.py) and its tables (benchmarks/classify_bench.py) and the
demo (benchmarks/classify_demo.py) at its smallest size, on a small fake library."""

import dataclasses
import json
import os

import pytest

from benchmarks import classify_bench, classify_demo, classify_experiment
from tests.factories import assert_one_error_line, run_in_process
from tfxl.data.stdlib_classification import stdlib_classification_task, write_labelled_jsonl

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def fake_library(root, files_per_package=10, size=2100):
    """A Lib/-shaped tree: packages `asyncio` and `email` with `files_per_package` modules of
    `size` bytes (and one short module each), `xml` with too few, `z` and a top-level module."""
    def write(relative, text):
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for package in ("asyncio", "email"):
        for i in range(files_per_package):
            line = f"{package}_{i} = {i}\n"
            write(f"{package}/m{i:02d}.py", line * (size // len(line) + 1))
        write(f"{package}/short.py", "x = 1\n")
    write("xml/only.py", "g = 1\n" * 400)
    write("z/__init__.py", "z = 1\n")
    write("top.py", "t = 1\n")
    write("site-packages/p/x.py", "s = 1\n" * 400)
    return str(root)


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    return fake_library(tmp_path_factory.mktemp("lib"))


def test_documents_are_a_packages_modules_and_the_corpus_is_every_other_file(library):
    task = stdlib_classification_task(library, packages=("asyncio", "email", "xml", "absent"),
                                      max_per_package=4, seed=3)
    assert task.labels == ("asyncio", "email")  # xml: too few files; absent: none
    assert task.counts() == {"asyncio": 4, "email": 4}
    assert all(path.startswith(label + os.sep) and "short" not in path
               for path, label in task.documents)
    corpus = sorted(os.path.relpath(p, library) for p in task.lm_train + task.lm_valid)
    # whole labelled packages stay out, their short modules too; site-packages is not the library
    assert corpus == ["top.py", "xml/only.py", "z/__init__.py"]
    assert stdlib_classification_task(library, packages=("asyncio", "email"), max_per_package=4,
                                      seed=3) == task  # seeded
    assert stdlib_classification_task(library, packages=("asyncio", "email"), max_per_package=4,
                                      seed=4).documents != task.documents


def test_jsonl_holds_each_document_once_and_skips_what_is_not_utf8(library, tmp_path):
    task = stdlib_classification_task(library, packages=("asyncio", "email"))
    with open(os.path.join(library, task.documents[0][0]), "rb") as f:
        original = f.read()
    with open(os.path.join(library, task.documents[0][0]), "wb") as f:
        f.write(b"\xff" + original)
    try:
        skipped = write_labelled_jsonl(str(tmp_path / "d.jsonl"), task)
    finally:
        with open(os.path.join(library, task.documents[0][0]), "wb") as f:
            f.write(original)
    rows = [json.loads(line) for line in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert skipped == [task.documents[0][0]]
    assert [(r["path"], r["label"]) for r in rows] == list(task.documents[1:])
    with open(os.path.join(library, rows[0]["path"])) as f:
        assert rows[0]["text"] == f.read()


def test_no_two_packages_is_refused(library):
    with pytest.raises(ValueError, match="fewer than two"):
        stdlib_classification_task(library, packages=("asyncio", "xml"))


@pytest.mark.parametrize("marker", [1, 8])
def test_probe_label_is_set_by_the_first_and_last_marker_runs_alone(marker):
    documents = classify_experiment.probe_documents(200, 300, seed=0, marker=marker)
    assert {len(d["text"]) for d in documents} == {300}
    for d in documents:
        first, filler, last = d["text"][:marker], d["text"][marker:-marker], d["text"][-marker:]
        assert first in ("A" * marker, "B" * marker) and last in ("A" * marker, "B" * marker)
        assert filler.islower() and filler.isalpha()
        assert d["label"] == ("same" if first == last else "different")
    assert 70 < sum(d["label"] == "same" for d in documents) < 130
    assert classify_experiment.probe_documents(5, 300, seed=0, marker=marker) == documents[:5]


@pytest.mark.large
def test_probe_trains_on_its_curriculum_in_order_and_tests_every_length(tmp_path):
    sizes = dataclasses.replace(classify_demo.SIZES["smallest"], probe_train=8, probe_test=6,
                                probe_marker=2, probe_stages=((12, 1), (40, 2)),
                                probe_test_lengths=(40, 80))
    trial = classify_experiment.probe_trial(str(tmp_path), sizes)
    assert [(n, epochs) for _, epochs, n in trial.stages] == [(13, 1), (41, 2)]  # <eod> + bytes
    assert trial.main == "40" and trial.by == "by_length"
    result = classify_experiment.run_trial(trial, sizes, None, log=lambda *a: None)
    assert result["labels"] == ["different", "same"] and result["test_documents"] == 6
    for reading, tokens in (("memory", {"40": 41, "80": 81}), ("no_memory", {"40": 41, "80": 81}),
                            ("truncation", {"40": 16, "80": 16})):
        entry = result["readings"][reading]
        assert [len(stage["losses"]) for stage in entry["stages"]] == [1, 2]
        assert {k: r["tokens_read"] for k, r in entry["by_length"].items()} == tokens
        assert all(r["documents"] == 6 for r in entry["by_length"].values())
        assert entry["accuracy"] == entry["by_length"]["40"]["accuracy"]
    tables = classify_bench.markdown_tables({"probe": result})  # BENCHMARKS.md's, from the JSON
    memory = result["readings"]["memory"]
    assert (f"| with memory | {memory['accuracy']:.3f} | {memory['macro_f1']:.3f} | 41 |"
            in tables)
    assert "| accuracy by document length (bytes) | 40 | 80 |" in tables


@pytest.mark.large
def test_demo_at_its_smallest_size_prints_the_three_readings_and_plots(library, tmp_path):
    out = tmp_path / "demo"
    result = run_in_process("benchmarks.classify_demo", f"--out={out}", "--size=smallest",
                            f"--stdlib_root={library}")
    assert result.returncode == 0, result.stderr[-3000:]
    for row in ("with memory", "no memory (mean of segment probabilities)",
                "truncation (first T)"):
        assert f"| {row} " in result.stdout
    assert (out / "accuracy_vs_tokens.png").read_bytes().startswith(PNG_SIGNATURE)
    # Progress while it runs: a line per epoch of each reading; no missing-gradient warning.
    for reading in classify_experiment.READINGS:
        assert f"stdlib {reading}, 32-token documents: epoch 1/1, loss" in result.stdout
    assert "Gradients do not exist" not in result.stderr
    results = json.loads((out / "results.json").read_text())
    readings = results["stdlib"]["readings"]
    assert sorted(readings) == sorted(classify_experiment.READINGS)
    assert sorted(readings["memory"]["by_tokens_read"]) == ["16", "32"]
    assert results["data"]["splits"]["test"]["documents"] == readings["memory"][
        "by_tokens_read"]["32"]["documents"] > 0


def test_demo_refuses_a_library_without_two_packages(tmp_path):
    (tmp_path / "lib" / "asyncio").mkdir(parents=True)
    result = run_in_process("benchmarks.classify_demo", f"--out={tmp_path / 'demo'}",
                            "--size=smallest", f"--stdlib_root={tmp_path / 'lib'}")
    assert_one_error_line(result, str(tmp_path / "lib"), "fewer than two")
    assert not (tmp_path / "demo").exists()
