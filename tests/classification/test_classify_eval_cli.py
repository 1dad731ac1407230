"""tfxl-classify-eval: a .keras classifier over every document of a split, the result of
`evaluate_classifier` as one JSON line by label name; a model that does not fit the data is one
`error:` line, exit 2, with nothing written."""

import json
import zipfile

import keras
import pytest

from factories import assert_one_error_line, run_in_process, run_tool, tiny_config, tiny_lm
from tfxl.classification import DocumentClassifier, evaluate_classifier
from tfxl.data.classification import (ClassificationConfig, classification_dataset,
                                      prepare_classification)

TOOL = "tfxl.classification.evaluate_main"
DOCUMENTS = [(f"{'ab' * (i % 4)}d{i}", "cat dog eel".split()[i % 3]) for i in range(7)]


@pytest.fixture(scope="module")
def data_and_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("classify_eval")
    (root / "t.jsonl").write_text("".join(json.dumps({"text": t, "label": y}) + "\n"
                                          for t, y in DOCUMENTS))
    prepare_classification(ClassificationConfig(
        output_dir=str(root / "data"), train=[str(root / "t.jsonl")], valid_fraction=0.0,
        test_fraction=0.0), log=lambda *a: None)
    keras.utils.set_random_seed(4)
    model = DocumentClassifier(tiny_config(vocab_size=258, init_std=0.5), 3, segment_len=4)
    model.save(root / "classifier.keras")
    return root


@pytest.mark.large
def test_the_tool_prints_evaluate_classifiers_result_by_label_name(data_and_model, tmp_path):
    root = data_and_model
    output = tmp_path / "result.json"
    done = run_in_process(TOOL, f"--model={root / 'classifier.keras'}",
                          f"--data_dir={root / 'data'}", "--split=train", "--batch_size=2",
                          f"--output={output}")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert json.loads(output.read_text()) == result
    model = keras.saving.load_model(root / "classifier.keras")
    want = evaluate_classifier(model, classification_dataset(str(root / "data"), "train", 7, 4),
                               7)
    assert result["documents"] == 7 and result["labels"] == ["cat", "dog", "eel"]
    assert result["confusion"] == want.confusion.tolist()
    assert result["loss"] == pytest.approx(want.loss, abs=1e-6)
    assert result["macro_f1"] == pytest.approx(want.macro_f1)
    assert set(result["per_class_f1"]) == {"cat", "dog", "eel"}


def test_a_model_that_does_not_fit_the_data_is_one_error_line(data_and_model, tmp_path):
    root = data_and_model
    data = f"--data_dir={root / 'data'}", "--split=train"
    output = tmp_path / "result.json"
    four = DocumentClassifier(tiny_config(vocab_size=258), 4, segment_len=4)
    four.save(tmp_path / "four.keras")
    assert_one_error_line(run_in_process(TOOL, f"--model={tmp_path / 'four.keras'}", *data,
                                         f"--output={output}"), "4 classes", "3 labels")
    small = DocumentClassifier(tiny_config(vocab_size=100), 3, segment_len=4)
    small.save(tmp_path / "small.keras")
    assert_one_error_line(run_in_process(TOOL, f"--model={tmp_path / 'small.keras'}", *data),
                          "token ids up to 257", "vocabulary of 100")
    tiny_lm().save(tmp_path / "lm.keras")
    assert_one_error_line(run_in_process(TOOL, f"--model={tmp_path / 'lm.keras'}", *data,
                                         f"--output={output}"), "not a DocumentClassifier")
    assert_one_error_line(run_in_process(TOOL, f"--model={root / 'classifier.keras'}",
                                         data[0]), "split 'test' is not in the manifest")
    assert_one_error_line(run_in_process(TOOL, *data), "--model is required")
    assert not output.exists()


def test_a_keras_file_with_one_byte_flipped_is_one_error_line(data_and_model, tmp_path):
    root = data_and_model
    damaged = tmp_path / "damaged.keras"
    content = bytearray((root / "classifier.keras").read_bytes())
    with zipfile.ZipFile(root / "classifier.keras") as archive:
        weights = archive.getinfo("model.weights.h5")
    # One byte inside the stored weights: the archive's CRC-32 of that member no longer holds.
    content[weights.header_offset + 30 + len(weights.filename) + weights.compress_size // 2] ^= 1
    damaged.write_bytes(bytes(content))
    output = tmp_path / "result.json"
    assert_one_error_line(run_in_process(TOOL, f"--model={damaged}", f"--data_dir={root / 'data'}",
                                         "--split=train", f"--output={output}"),
                          str(damaged), "damaged")
    assert not output.exists()


def test_a_batch_no_machine_holds_is_refused_before_anything_is_allocated(data_and_model,
                                                                          tmp_path):
    from tfxl.classification.evaluate_main import check_evaluation_size, evaluation_batch
    # A batch beyond the split's documents reads as the split: no rows of padding are made.
    assert evaluation_batch(100_000_000, documents=7, replicas=1) == 7
    assert evaluation_batch(100_000_000, documents=7, replicas=2) == 8
    assert evaluation_batch(3, documents=7, replicas=1) == 3
    root = data_and_model
    output = tmp_path / "result.json"
    # --max_tokens past MAX_DOCUMENT_TOKENS is refused as the flags are read.
    assert_one_error_line(run_in_process(TOOL, f"--model={root / 'classifier.keras'}",
                                         f"--data_dir={root / 'data'}", "--split=train",
                                         "--batch_size=100000000", "--max_tokens=1000000000000",
                                         f"--output={output}"),
                          "--max_tokens=1000000000000", "not an integer in the range")
    assert not output.exists()
    # Documents of 2^30 tokens in batches of 7 (the tool reads at most a split's longest
    # document, so only a data dir of such documents comes here): the estimate names both.
    model = keras.saving.load_model(root / "classifier.keras")
    with pytest.raises(ValueError, match="exceeds this host's.*--batch_size .7. or --max_tokens"):
        check_evaluation_size(model, 7, 1, 2**30, limit=2**34)


@pytest.mark.large
@pytest.mark.subprocess
def test_a_huge_batch_size_evaluates_the_split_instead_of_aborting(data_and_model):
    root = data_and_model
    done = run_tool(TOOL, f"--model={root / 'classifier.keras'}", f"--data_dir={root / 'data'}",
                    "--split=train", "--batch_size=100000000")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["documents"] == 7


def test_the_tool_reads_as_the_model_was_trained_unless_told_and_shows_progress(data_and_model,
                                                                                 tmp_path):
    root = data_and_model
    keras.utils.set_random_seed(4)
    model = DocumentClassifier(tiny_config(vocab_size=258, init_std=0.5), 3, segment_len=4,
                               pooling="segment_attention", max_tokens=4)
    model.save(tmp_path / "first4.keras")
    data = str(root / "data")

    def evaluated(*more):
        done = run_in_process(TOOL, f"--model={tmp_path / 'first4.keras'}", f"--data_dir={data}",
                              "--split=train", "--batch_size=4", *more)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout), done.stderr

    def want(max_tokens, reading="memory"):
        model.set_reading(reading=reading, max_tokens=max_tokens, whole=max_tokens is None)
        return evaluate_classifier(model, classification_dataset(data, "train", 7, 4), 7)

    result, stderr = evaluated()
    assert (result["reading"], result["max_tokens"]) == ("memory", 4)
    assert result["loss"] == pytest.approx(want(4).loss, abs=1e-6)
    assert "documents 7/7 (100%)" in stderr and "documents/s" in stderr
    whole, _ = evaluated("--max_tokens=0")
    from tfxl.data.manifest import load_manifest, split_info
    longest = split_info(load_manifest(data, kind=None), "train")["max_length"]
    assert whole["max_tokens"] is None and whole["most_tokens_per_document"] == longest
    assert result["most_tokens_per_document"] == 4 and "tokens_read" not in result
    assert whole["loss"] == pytest.approx(want(None).loss, abs=1e-6)
    alone, _ = evaluated("--reading=no_memory", "--max_tokens=8")
    assert (alone["reading"], alone["max_tokens"]) == ("no_memory", 8)
    assert alone["loss"] == pytest.approx(want(8, "no_memory").loss, abs=1e-5)
