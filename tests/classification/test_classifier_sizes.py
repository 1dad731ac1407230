"""Sizes the classifier's tools are given are bounded before anything is allocated or written: a
--max_tokens past MAX_DOCUMENT_TOKENS is one `error:` line naming the flag, and no batch is padded
past the longest document of its split, whatever bound a reading names."""

import json

import pytest

from factories import assert_one_error_line, prepare_labelled, run_in_process, tiny_config
from tfxl.classification.readings import MAX_DOCUMENT_TOKENS
from tfxl.data.manifest import load_manifest, split_info
from tfxl.train.tasks.classification import ClassificationTask, DocumentData

DOCUMENTS = [("ab" * (i % 5 + 1) + "c" * i, "xy"[i % 2]) for i in range(10)]
MODEL_FLAGS = ("--n_layer=1", "--d_model=8", "--n_head=2", "--d_head=4", "--d_inner=8",
               "--tgt_len=4", "--mem_len=4", "--train_batch_size=2", "--train_steps=1",
               "--steps_per_loop=1", "--lease_settle=0")
HUGE = 10**12


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(prepare_labelled(tmp_path_factory.mktemp("sizes"), DOCUMENTS,
                                valid_fraction=0.3))


def test_max_tokens_past_the_bound_is_one_error_line_and_nothing_is_written(data_dir, tmp_path):
    model_dir, exports, output = tmp_path / "m", tmp_path / "exports", tmp_path / "r.json"
    for flag in ("--max_tokens", "--eval_max_tokens"):
        assert_one_error_line(run_in_process(
            "tfxl.train.classify_main", f"--data_dir={data_dir}", f"--model_dir={model_dir}",
            *MODEL_FLAGS, f"{flag}={HUGE}"), f"{flag}={HUGE}", str(MAX_DOCUMENT_TOKENS))
    assert_one_error_line(run_in_process(
        "tfxl.classification.evaluate_main", f"--model={tmp_path / 'c.keras'}",
        f"--data_dir={data_dir}", f"--max_tokens={HUGE}", f"--output={output}"),
        f"--max_tokens={HUGE}", str(MAX_DOCUMENT_TOKENS))
    assert_one_error_line(run_in_process(
        "tfxl.serving.export_main", f"--model={tmp_path / 'c.keras'}",
        f"--output_dir={exports}", f"--max_tokens={HUGE}"), f"--max_tokens={HUGE}")
    assert not model_dir.exists() and not exports.exists() and not output.exists()


def test_the_bound_rounded_up_to_a_segment_stays_an_int32():
    assert -(-MAX_DOCUMENT_TOKENS // 4096) * 4096 < 2**31
    assert 2 * MAX_DOCUMENT_TOKENS - 1 < 2**31  # rounded up to a segment of any length up to it


def test_no_batch_is_padded_past_the_longest_document(data_dir):
    manifest = load_manifest(data_dir, kind=None)
    longest = split_info(manifest, "train")["max_length"]
    data = DocumentData(None, data_dir, manifest, 4, max_tokens=MAX_DOCUMENT_TOKENS,
                        eval_max_tokens=MAX_DOCUMENT_TOKENS)
    assert data.length("train") == longest
    assert data.length("valid") == split_info(manifest, "valid")["max_length"]
    assert DocumentData(None, data_dir, manifest, 4, max_tokens=3).length("train") == 3
    task = ClassificationTask(tiny_config(vocab_size=258, tgt_len=4), data_dir=data_dir,
                              head={"num_classes": 2}, max_tokens=MAX_DOCUMENT_TOKENS)
    assert task.document_tokens(manifest) == -(-longest // 4) * 4


@pytest.mark.large
def test_a_bound_past_every_document_trains_and_evaluates_whole_documents(data_dir, tmp_path):
    model_dir = tmp_path / "m"
    done = run_in_process("tfxl.train.classify_main", f"--data_dir={data_dir}",
                          f"--model_dir={model_dir}", *MODEL_FLAGS,
                          f"--max_tokens={MAX_DOCUMENT_TOKENS}")
    assert done.returncode == 0, done.stderr[-3000:]
    evaluated = run_in_process("tfxl.classification.evaluate_main", f"--model={model_dir}",
                               f"--data_dir={data_dir}", "--split=train")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    result = json.loads(evaluated.stdout)
    manifest = load_manifest(data_dir, kind=None)
    assert result["max_tokens"] == MAX_DOCUMENT_TOKENS
    assert result["most_tokens_per_document"] == split_info(manifest, "train")["max_length"]
