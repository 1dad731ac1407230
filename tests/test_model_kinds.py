"""Wrong kinds of model: a model_dir records the kind of run that made it (data.json's kind), and a
tool given another kind's model_dir says which tool made it in one `error:` line, exit 2, before
it reads any checkpoint or setting and with nothing written; tfxl-classify-eval takes a
classifier's model_dir for its classifier.keras."""

import json
import os
import types

import pytest

from factories import (assert_one_error_line, prepare_labelled, random_bytes_data,
                       run_in_process, tiny_config, vocab_size_of)
from tfxl.data import manifest as manifests
from tfxl.data.manifest import load_manifest
from tfxl.model_dir import (CLASSIFICATION, LANGUAGE_MODEL, ModelDir, check_or_store_config,
                            check_run_kind, run_kind)

DOCUMENTS = [("ab" * (i % 4 + 1) + "c" * i, "xy"[i % 2]) for i in range(8)]
# The tiny model flags of every tool run here (the data's vocabulary is added).
MODEL_FLAGS = ("--n_layer=1", "--d_model=8", "--n_head=2", "--d_head=4", "--d_inner=8",
               "--mem_len=4", "--train_batch_size=2", "--train_steps=2", "--steps_per_loop=1",
               "--lease_settle=0")


def snapshot(root):
    """{relative path: bytes} of every file under `root`: what a refused tool must leave."""
    return {os.path.relpath(os.path.join(d, name), root):
            open(os.path.join(d, name), "rb").read()
            for d, _, names in os.walk(root) for name in names}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A language model's and a classifier's model_dir as their tasks claim them (config.json,
    data.json: what the tools read first), the classifier's with its classifier.keras and a
    segment length the language-model data does not have (tgt_len 16, the data 8)."""
    import keras

    from tfxl.classification import DocumentClassifier
    from tfxl.train.tasks.classification import ClassificationTask
    from tfxl.train.tasks.language_model import LanguageModelTask
    root = tmp_path_factory.mktemp("kinds")
    (root / "lm").mkdir()
    lm_data = random_bytes_data(root / "lm", tgt_len=8, num_streams=2, train_bytes=2000)
    (root / "cl").mkdir()
    cl_data = prepare_labelled(root / "cl", DOCUMENTS)
    vocab = vocab_size_of(lm_data)
    lm_dir, classifier_dir = root / "runs" / "lm", root / "runs" / "kinds"
    LanguageModelTask(tiny_config(vocab_size=vocab, tgt_len=8), data_dir=str(lm_data)
                      ).claim_model_dir(str(lm_dir), types.SimpleNamespace(
                          manifest=load_manifest(str(lm_data)), data_dir=str(lm_data)))
    config = tiny_config(vocab_size=vocab, tgt_len=16, mem_len=16)
    ClassificationTask(config, data_dir=str(cl_data), head={"num_classes": 2}
                       ).claim_model_dir(str(classifier_dir), types.SimpleNamespace(
                           manifest=load_manifest(str(cl_data), kind=None),
                           data_dir=str(cl_data)))
    keras.utils.set_random_seed(0)
    DocumentClassifier(config, 2).save(ModelDir(str(classifier_dir)).classifier)
    return types.SimpleNamespace(lm_data=lm_data, cl_data=cl_data, lm=lm_dir,
                                 classifier=classifier_dir, root=root)


def test_the_kinds_are_the_data_manifests_kinds():
    assert (LANGUAGE_MODEL, CLASSIFICATION) == (manifests.LANGUAGE_MODEL,
                                                manifests.CLASSIFICATION)


def test_each_task_records_the_kind_of_its_run(runs):
    assert json.loads((runs.lm / "data.json").read_text())["kind"] == LANGUAGE_MODEL
    assert json.loads((runs.classifier / "data.json").read_text())["kind"] == CLASSIFICATION
    assert run_kind(str(runs.lm)) == LANGUAGE_MODEL
    assert run_kind(str(runs.classifier)) == CLASSIFICATION
    assert run_kind(str(runs.root / "unclaimed")) is None


def test_a_data_json_without_its_kind_is_read_by_its_segment_length(tmp_path):
    for tgt_len, kind in ((8, LANGUAGE_MODEL), (None, CLASSIFICATION)):
        model_dir = tmp_path / str(tgt_len)
        model_dir.mkdir()
        (model_dir / "data.json").write_text(json.dumps(
            {"vocab_sha256": "0" * 64, "vocab_size": 258, "tgt_len": tgt_len, "data_dir": "d"}))
        assert run_kind(str(model_dir)) == kind


def test_a_data_json_of_an_unknown_kind_is_named_damaged(tmp_path):
    (tmp_path / "data.json").write_text(json.dumps({"kind": "regression", "tgt_len": None}))
    with pytest.raises(ValueError, match=r"data\.json is damaged: its field 'kind'.*regression"):
        run_kind(str(tmp_path))


def test_check_run_kind_names_the_tool_that_made_the_run(runs):
    check_run_kind(str(runs.classifier), CLASSIFICATION, "unused")
    check_run_kind(str(runs.root / "unclaimed"), LANGUAGE_MODEL, "unused")
    with pytest.raises(ValueError) as refused:
        check_run_kind(str(runs.classifier), LANGUAGE_MODEL, "do this", flag="--model_dir")
    assert str(refused.value) == (
        f"--model_dir={runs.classifier} is a tfxl-classify-train run (a document classifier), "
        "not a tfxl-train run; do this")
    with pytest.raises(ValueError, match=f"^{runs.lm} is a tfxl-train run \\(a language model\\)"):
        check_run_kind(str(runs.lm), CLASSIFICATION, "do that")


def test_a_trainer_refuses_a_model_dir_of_the_other_kind_before_its_config(runs):
    before = snapshot(runs.classifier)
    other = tiny_config(vocab_size=258, d_model=48)  # another model too: the kind is said first
    with pytest.raises(ValueError, match="is a tfxl-classify-train run.*give tfxl-train another"):
        check_or_store_config(str(runs.classifier), other)
    with pytest.raises(ValueError, match="is a tfxl-train run.*give tfxl-classify-train another"):
        check_or_store_config(str(runs.lm), other, kind=CLASSIFICATION)
    assert snapshot(runs.classifier) == before


def test_the_language_model_tools_refuse_a_classifiers_model_dir(runs, tmp_path):
    kinds, lm_data = runs.classifier, runs.lm_data
    before = snapshot(runs.root / "runs")
    said = f"{kinds} is a tfxl-classify-train run (a document classifier)"
    # Its tgt_len (16) is not the data's (8): the kind is the reason given, not the segment length.
    line = assert_one_error_line(run_in_process(
        "tfxl.train.evaluate", f"--model_dir={kinds}", f"--data_dir={lm_data}"),
        f"--model_dir={said}", f"tfxl-classify-eval --model={kinds}")
    assert "tgt_len" not in line
    assert_one_error_line(run_in_process(
        "tfxl.serving.export_main", f"--model={kinds}", f"--output_dir={tmp_path / 'exports'}"),
        said, f"{kinds}/classifier.keras")
    assert_one_error_line(run_in_process(
        "tfxl.serving.generate_main", f"--model={kinds}", f"--data_dir={lm_data}",
        "--prompt=ab"), said)
    assert_one_error_line(run_in_process(
        "tfxl.train.main", f"--model_dir={kinds}", f"--data_dir={lm_data}", "--tgt_len=16",
        *MODEL_FLAGS), f"--model_dir={said}", "give tfxl-train another --model_dir")
    for trainer, data in (("tfxl.train.main", lm_data), ("tfxl.train.classify_main",
                                                          runs.cl_data)):
        assert_one_error_line(run_in_process(
            trainer, f"--init_checkpoint={kinds}", f"--model_dir={tmp_path / 'new'}",
            f"--data_dir={data}", "--tgt_len=8", *MODEL_FLAGS), f"--init_checkpoint={said}")
    assert not (tmp_path / "exports").exists() and not (tmp_path / "new").exists()
    assert snapshot(runs.root / "runs") == before


def test_the_classification_tools_refuse_a_language_models_model_dir(runs, tmp_path):
    lm, cl_data = runs.lm, runs.cl_data
    before = snapshot(runs.root / "runs")
    said = f"{lm} is a tfxl-train run (a language model), not a tfxl-classify-train run"
    output = tmp_path / "result.json"
    assert_one_error_line(run_in_process(
        "tfxl.classification.evaluate_main", f"--model={lm}", f"--data_dir={cl_data}",
        "--split=train", f"--output={output}"), f"--model={said}", "its .keras file")
    assert_one_error_line(run_in_process(
        "tfxl.train.classify_main", f"--model_dir={lm}", f"--data_dir={cl_data}",
        "--tgt_len=8", *MODEL_FLAGS), f"--model_dir={said}",
        "give tfxl-classify-train another --model_dir")
    assert not output.exists()
    assert snapshot(runs.root / "runs") == before


def test_classify_eval_says_what_to_give_for_a_model_dir_without_a_classifier(runs, tmp_path):
    unfinished = tmp_path / "unfinished"
    os.makedirs(unfinished)
    for name in ("config.json", "data.json"):  # claimed, not finished: no classifier.keras yet
        (unfinished / name).write_bytes((runs.classifier / name).read_bytes())
    data = (f"--data_dir={runs.cl_data}", "--split=train")
    tool = "tfxl.classification.evaluate_main"
    assert_one_error_line(run_in_process(tool, f"--model={unfinished}", *data),
                          f"{unfinished} has no classifier.keras yet", "when its run finishes")
    assert_one_error_line(run_in_process(tool, f"--model={tmp_path / 'none'}", *data),
                          f"--model={tmp_path / 'none'}/config.json not found",
                          "a .keras file or a model_dir written by tfxl-classify-train")
    export = tmp_path / "export"
    os.makedirs(export)
    (export / "saved_model.pb").write_bytes(b"")
    assert_one_error_line(run_in_process(tool, f"--model={export}", *data),
                          "is an exported SavedModel", "give the classifier's .keras file")


def test_classify_eval_reads_a_classifiers_model_dir_as_its_classifier_keras(runs):
    from tfxl.checkpoints.loading import classifier_file
    assert classifier_file(str(runs.classifier)) == str(runs.classifier / "classifier.keras")
    assert classifier_file("gs://b/any.keras") == "gs://b/any.keras"  # a file: loading judges it


@pytest.mark.large
def test_classify_eval_of_a_model_dir_is_that_of_its_classifier_keras(runs):
    data = (f"--data_dir={runs.cl_data}", "--split=train")
    tool = "tfxl.classification.evaluate_main"
    of_dir = run_in_process(tool, f"--model={runs.classifier}", *data)
    assert of_dir.returncode == 0, of_dir.stderr[-3000:]
    of_file = run_in_process(tool, f"--model={runs.classifier / 'classifier.keras'}", *data)
    assert json.loads(of_dir.stdout) == json.loads(of_file.stdout)


@pytest.mark.large
def test_runs_the_trainers_make_are_told_apart_by_every_tool(runs, tmp_path):
    """The same, on model_dirs tfxl-train and tfxl-classify-train (--tgt_len=16) trained."""
    lm, kinds = tmp_path / "lm", tmp_path / "kinds"
    for trainer, model_dir, data, tgt_len in (
            ("tfxl.train.main", lm, runs.lm_data, 8),
            ("tfxl.train.classify_main", kinds, runs.cl_data, 16)):
        done = run_in_process(trainer, f"--model_dir={model_dir}", f"--data_dir={data}",
                              f"--tgt_len={tgt_len}", *MODEL_FLAGS)
        assert done.returncode == 0, done.stderr[-3000:]
    assert (run_kind(str(lm)), run_kind(str(kinds))) == (LANGUAGE_MODEL, CLASSIFICATION)
    line = assert_one_error_line(run_in_process(
        "tfxl.train.evaluate", f"--model_dir={kinds}", f"--data_dir={runs.lm_data}"),
        f"{kinds} is a tfxl-classify-train run")
    assert "tgt_len" not in line
    for tool, more in (("tfxl.serving.export_main", f"--output_dir={tmp_path / 'exports'}"),
                       ("tfxl.serving.generate_main", "--prompt=ab")):
        assert_one_error_line(run_in_process(tool, f"--model={kinds}",
                                             f"--data_dir={runs.lm_data}", more),
                              f"{kinds} is a tfxl-classify-train run")
    assert_one_error_line(run_in_process(
        "tfxl.classification.evaluate_main", f"--model={lm}", f"--data_dir={runs.cl_data}",
        "--split=train"), f"{lm} is a tfxl-train run (a language model)")
    evaluated = run_in_process("tfxl.classification.evaluate_main", f"--model={kinds}",
                               f"--data_dir={runs.cl_data}", "--split=train")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert json.loads(evaluated.stdout)["documents"] == len(DOCUMENTS)
