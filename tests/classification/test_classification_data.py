"""Classification data: each input layout prepares the same records, labels and counts; splits;
the language model's tokenizer; bad inputs are one ValueError naming file and line; the reader's
batches feed the classifier."""

import csv
import json

import numpy as np
import pytest

from tfxl.data import DataError
from tfxl.data.classification import (LENGTHS, TOKEN_IDS, ClassificationConfig,
                                      classification_dataset, label_order,
                                      load_classification_manifest, prepare_classification)
from tfxl.data.manifest import load_manifest
from tfxl.data.tokenizers import BytesTokenizer

TRAIN = [("a tale of two cities", "book"), ("x = 1\nprint(x)", "code"),
         ("war and peace, a long one", "book"), ("def f(): pass", "code"),
         ("emma", "book")]
VALID = [("import os", "code"), ("moby dick", "book")]


def write_layout(root, layout, name, documents):
    """`documents` [(text, label)] written as `layout`; returns the input path."""
    if layout == "jsonl":
        path = root / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in documents))
    elif layout == "csv":
        path = root / f"{name}.csv"
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["id", "text", "label"])
            writer.writerows([i, t, y] for i, (t, y) in enumerate(documents))
    else:
        path = root / name
        for i, (text, label) in enumerate(documents):
            (path / label).mkdir(parents=True, exist_ok=True)
            (path / label / f"{i:03d}.txt").write_text(text)
    return str(path)


def prepare(tmp_path, layout="jsonl", train=TRAIN, valid=VALID, **options):
    config = ClassificationConfig(
        output_dir=str(tmp_path / "data"), format=layout,
        train=[write_layout(tmp_path, layout, "train", train)],
        valid=[write_layout(tmp_path, layout, "valid", valid)] if valid else (), **options)
    return prepare_classification(config, log=lambda *a: None), config.output_dir


def read_all(data_dir, split, **kwargs):
    batches = list(classification_dataset(data_dir, split, 2, 4, **kwargs))
    return batches, [(BytesTokenizer().decode(ids[1:n]), int(label))
                     for features, labels in batches
                     for ids, n, label in zip(features[TOKEN_IDS].numpy(),
                                              features[LENGTHS].numpy(), labels.numpy())]


@pytest.mark.parametrize("layout", ["jsonl", "csv", "folders"])
def test_each_layout_prepares_whole_documents_with_labels_and_counts(tmp_path, layout):
    manifest, data_dir = prepare(tmp_path, layout, test_fraction=0.0)
    assert manifest["kind"] == "classification" and manifest["labels"] == ["book", "code"]
    train = manifest["splits"]["train"]
    assert train["class_counts"] == {"book": 3, "code": 2} and train["documents"] == 5
    assert train["tokens"] == sum(len(t.encode()) + 1 for t, _ in TRAIN)  # <eod> first
    assert manifest["splits"]["valid"]["class_counts"] == {"book": 1, "code": 1}
    assert set(manifest["splits"]) == {"train", "valid"}
    assert load_classification_manifest(data_dir)["labels"] == ["book", "code"]
    batches, documents = read_all(data_dir, "train")
    labels = manifest["labels"]
    expected = TRAIN if layout != "folders" else sorted(TRAIN, key=lambda d: d[1])  # by folder
    assert documents == [(text, labels.index(label)) for text, label in expected]
    for features, _ in batches:
        ids = features[TOKEN_IDS].numpy()
        assert ids.shape[1] % 4 == 0 and ids.shape[1] - 4 < features[LENGTHS].numpy().max()
        assert (ids[:, 0] == BytesTokenizer.eod_id).all()


def test_valid_and_test_drawn_from_train_by_seed(tmp_path):
    documents = [(f"document {i}", "ab"[i % 2]) for i in range(40)]
    manifest, _ = prepare(tmp_path, train=documents, valid=None, valid_fraction=0.25,
                          test_fraction=0.25, seed=3)
    splits = manifest["splits"]
    assert set(splits) == {"train", "valid", "test"}
    assert sum(s["documents"] for s in splits.values()) == 40
    assert all(s["documents"] >= 3 for s in splits.values())
    (tmp_path / "again").mkdir()
    again, _ = prepare(tmp_path / "again", train=documents, valid=None, valid_fraction=0.25,
                       test_fraction=0.25, seed=3)
    assert ({k: v["class_counts"] for k, v in again["splits"].items()}
            == {k: v["class_counts"] for k, v in splits.items()})


def test_the_language_models_tokenizer_is_used(tmp_path):
    from tfxl.data.prepare import PrepareConfig, prepare as prepare_lm
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a tale of two cities, war and peace, emma, moby dick\n" * 20)
    lm_data = str(tmp_path / "lm")
    prepare_lm(PrepareConfig(output_dir=lm_data, train=[str(corpus)], valid=[str(corpus)],
                             test=[str(corpus)], tokenizer="chars", tgt_len=8, num_streams=1),
               log=lambda *a: None)
    manifest, data_dir = prepare(tmp_path, tokenizer_dir=lm_data, test_fraction=0.0)
    lm_manifest = load_manifest(lm_data)
    assert manifest["tokenizer"]["type"] == "chars"
    assert manifest["vocab_sha256"] == lm_manifest["vocab_sha256"]
    features, _ = next(iter(classification_dataset(data_dir, "train", 1, 4)))
    assert features[TOKEN_IDS].numpy()[0, 0] == lm_manifest["eod_id"]


def test_a_pass_has_a_known_length_that_is_its_number_of_batches(tmp_path):
    # Keras reads an unknown length's end as "Your input ran out of data", once per epoch
    manifest, data_dir = prepare(tmp_path, test_fraction=0.0)
    documents = manifest["splits"]["train"]["documents"]
    for batch, drop_remainder, skip in ((2, False, 0), (3, True, 0), (3, False, 1),
                                        (4, False, documents)):
        dataset = classification_dataset(data_dir, "train", batch, 4, shuffle=True,
                                         drop_remainder=drop_remainder, skip=skip)
        assert int(dataset.cardinality()) == sum(1 for _ in dataset) == (
            (documents - skip) // batch if drop_remainder else -(-(documents - skip) // batch))
    assert int(classification_dataset(data_dir, "train", 2, 4, repeat=True).cardinality()) < 0


def test_the_pipeline_runs_without_the_autotuning_thread(tmp_path):
    # whose iterators block their deletion for up to 60 s (tfxl.data.pipeline.pipeline_options)
    _, data_dir = prepare(tmp_path, test_fraction=0.0)
    options = classification_dataset(data_dir, "train", 2, 4, shuffle=True).options()
    assert options.autotune.enabled is False and options.deterministic is True


@pytest.mark.parametrize("layout,train,problem", [
    ("csv", "id,body,label\n1,hello,a\n", r"train\.csv: line 1: no column 'text'"),
    ("csv", "text,label\nhello,a\nworld,\n", r"train\.csv: line 3: no label"),
    ("jsonl", "", r"train\.jsonl: no documents"),
    ("jsonl", '{"text": "x", "label": "a"}\n{"text": "y"}\n', r"train\.jsonl: line 2: no label"),
    ("jsonl", '{"text": "x", "label": "a"}\nnot json\n', r"train\.jsonl: line 2 is not valid"),
])
def test_bad_inputs_are_one_value_error_naming_file_and_line(tmp_path, layout, train, problem):
    path = tmp_path / f"train.{layout}"
    path.write_text(train)
    config = ClassificationConfig(output_dir=str(tmp_path / "data"), format=layout,
                                  train=[str(path)])
    with pytest.raises(ValueError, match=problem):
        prepare_classification(config, log=lambda *a: None)
    assert not (tmp_path / "data").exists()


def test_a_valid_label_unknown_to_train_is_refused(tmp_path):
    with pytest.raises(DataError, match=r"valid\.jsonl: line 2: label 'poem' is not one of"):
        prepare(tmp_path, valid=[("import os", "code"), ("ode", "poem")])
    assert not (tmp_path / "data").exists()


def test_reader_caps_and_pads_to_a_static_length(tmp_path):
    _, data_dir = prepare(tmp_path, valid=None, test_fraction=0.0, valid_fraction=0.0)
    batches, documents = read_all(data_dir, "train", max_tokens=6, pad_to_max_tokens=True)
    assert all(b[0][TOKEN_IDS].shape[1] == 8 for b in batches)  # 6 rounded up to T = 4
    assert [text for text, _ in documents] == [t[:5] for t, _ in TRAIN]  # <eod> + 5


def test_batches_feed_the_classifier_and_language_model_readers_refuse_them(tmp_path):
    import tfxl.classification as classification
    from factories import tiny_config
    assert (TOKEN_IDS, LENGTHS) == (classification.TOKEN_IDS, classification.LENGTHS)
    _, data_dir = prepare(tmp_path, test_fraction=0.0)
    features, labels = next(iter(classification_dataset(data_dir, "valid", 2, 4)))
    model = classification.DocumentClassifier(tiny_config(vocab_size=258), 2)
    assert model(features).shape == (2, 2)
    with pytest.raises(DataError, match="holds classification data, not language model data"):
        load_manifest(data_dir)
    np.testing.assert_array_equal(labels.numpy(), [1, 0])


def test_integer_labels_are_ordered_by_value():
    assert label_order({"10", "2", "-1"}) == ["-1", "2", "10"]
    assert label_order({"b", "a", "10"}) == ["10", "a", "b"]


def test_a_hand_edited_manifest_is_refused_naming_the_field(tmp_path):
    manifest, data_dir = prepare(tmp_path, test_fraction=0.0)
    manifest["splits"]["train"]["class_counts"]["book"] += 1
    (tmp_path / "data" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match=r"'splits.train.class_counts' adds up to 6, "
                                        r"'splits.train.documents' is 5; re-run prepare_class"):
        classification_dataset(data_dir, "train", 2, 4)


def test_a_damaged_shard_is_named_before_reading(tmp_path):
    _, data_dir = prepare(tmp_path, test_fraction=0.0)
    shard = tmp_path / "data" / "valid.documents-00000-of-00001.tfrecord"
    data = bytearray(shard.read_bytes())
    data[20] ^= 0xFF  # same size, a record's CRC no longer matches
    shard.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"corrupt TFRecord shard .*valid\.documents-00000"):
        classification_dataset(data_dir, "valid", 2, 4)


def test_overwrite_replaces_the_shards_of_earlier_data(tmp_path):
    _, data_dir = prepare(tmp_path, test_fraction=0.0, num_shards=2)
    with pytest.raises(DataError, match="is not empty; pass --overwrite"):
        prepare(tmp_path, test_fraction=0.0)
    prepare(tmp_path, test_fraction=0.0, overwrite=True)
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [
        "manifest.json", "train.documents-00000-of-00001.tfrecord",
        "valid.documents-00000-of-00001.tfrecord"]


def test_the_manifest_records_only_the_fractions_that_drew_a_split(tmp_path):
    manifest, _ = prepare(tmp_path, test_fraction=0.2, valid_fraction=0.1)
    # --valid was given, test drawn: valid_fraction was not used, test_fraction was.
    assert manifest["source"]["valid_fraction"] is None
    assert manifest["source"]["test_fraction"] == 0.2
    assert load_classification_manifest(str(tmp_path / "data"))["source"]["valid_fraction"] is None
