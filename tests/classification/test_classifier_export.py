"""A DocumentClassifier exported by tfxl-export: classify_document and classify_text give the
Python model's probabilities for documents shorter than, equal to and many times longer than a
segment (read in-graph on the key/value memory), bad requests fail at the entry with one message
naming the input, and what does not fit is one `error:` line with nothing written.

One export for the whole file (an export costs seconds), made with the 2 GiB request limit
lowered so that the batch and length bounds can be crossed with tiny requests."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from factories import (assert_one_error_line, assert_refused_at_the_entry, load_as_served,
                       prepare_labelled, run_in_process, tiny_config, tiny_lm)
import tfxl.classification.signatures as classifier_signatures
import tfxl.saved_model.signature_set as signature_set
from tfxl.classification import POOLINGS, DocumentClassifier
from tfxl.classification.readings import LENGTHS, TOKEN_IDS
from tfxl.classification.signatures import ClassifierSignatures
from tfxl.data.classification import classification_dataset
from tfxl.data.tokenizers import BytesTokenizer
from tfxl.model_dir import EXPORT_RECORD

TOOL = "tfxl.serving.export_main"
T, M, K, V = 4, 3, 2, 258  # segment length, memory slots (< T), grad_segments, bytes vocabulary
LABELS = ["cat", "dog", "eel"]
DOCUMENTS = [("a" * n + "z", LABELS[n % 3]) for n in (0, 2, 3, 7, 20)]  # 2 to 22 tokens
LIMIT = 2**14  # MAX_MEMORY_BYTES of the export under test
# The bounds under LIMIT: a key/value memory row (float32 keys and values of 2 layers x 2 heads
# x 6 dims x M slots, bool valid) and a request's bytes per token (ids, their aligned copy, its
# mask: 9; attention pooling's float32 [16] summary per T tokens: 16).
ROW_BYTES, TOKEN_BYTES = 4 * 2 * 2 * 2 * 6 * M + M, 4 + 4 + 1 + 16
MAX_BATCH, MAX_TOKENS = LIMIT // ROW_BYTES, LIMIT // TOKEN_BYTES


def new_classifier(num_classes=3, **kwargs):
    keras.utils.set_random_seed(4)
    return DocumentClassifier(tiny_config(vocab_size=V, init_std=0.5), num_classes,
                              segment_len=T, mem_len=M, grad_segments=K, **kwargs)


READS = []  # the key_value_memory argument of each DocumentClassifier.call during the export


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(root, the classifier, its export's path): tfxl-export of a .keras classifier with its
    classification data dir (tokenizer and labels)."""
    root = tmp_path_factory.mktemp("classifier_export")
    prepare_labelled(root, DOCUMENTS)
    model = new_classifier(pooling="segment_attention")
    model.save(root / "classifier.keras")
    call = DocumentClassifier.call

    def counted(self, *args, **kwargs):
        READS.append(kwargs.get("key_value_memory"))
        return call(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(signature_set, "MAX_MEMORY_BYTES", LIMIT)
        patch.setattr(DocumentClassifier, "call", counted)
        done = run_in_process(TOOL, f"--model={root / 'classifier.keras'}",
                              f"--data_dir={root / 'data'}", f"--output_dir={root / 'exports'}")
    assert done.returncode == 0, done.stderr[-3000:]
    path = done.stdout.strip().splitlines()[-1]
    assert path == str(root / "exports" / "1")
    return root, model, path


@pytest.fixture(scope="module")
def signatures(exported):
    return tf.saved_model.load(exported[2]).signatures


def probabilities(model, token_ids, lengths):
    logits = model({TOKEN_IDS: np.asarray(token_ids, np.int32),
                    LENGTHS: np.asarray(lengths, np.int32)})
    return tf.nn.softmax(logits).numpy()


def test_key_value_memory_reads_as_the_layer_input_memory():
    # What the signatures run (the key/value memory, M < T) against what training runs; the
    # export's tests compare segment_attention's through the signatures.
    ids = np.random.default_rng(0).integers(0, V, (3, 13)).astype("int32")
    batch = {TOKEN_IDS: ids, LENGTHS: np.array([13, 4, 2], np.int32)}
    for pooling in [p for p in POOLINGS if p != "segment_attention"]:
        model = new_classifier(pooling=pooling)
        np.testing.assert_allclose(model(batch, key_value_memory=True).numpy(),
                                   model(batch).numpy(), atol=1e-5, err_msg=pooling)


def test_classify_document_equals_the_model_for_short_whole_and_long_documents(
        exported, signatures):
    _, model, _ = exported
    rng = np.random.default_rng(1)
    lengths = [2, T, 5 * T + 1]  # shorter than, equal to and many times longer than a segment
    # Padding of ids outside the vocabulary: padding is never read, nor checked.
    token_ids = np.full((3, max(lengths)), V + 7, np.int32)
    for row, n in enumerate(lengths):
        token_ids[row, :n] = rng.integers(0, V, n)
    want = probabilities(model, token_ids, lengths)
    out = signatures["classify_document"](token_ids=tf.constant(token_ids),
                                          lengths=tf.constant(lengths, tf.int32))
    np.testing.assert_allclose(out["probabilities"].numpy(), want, atol=1e-5)
    np.testing.assert_array_equal(out["label_ids"].numpy(), want.argmax(axis=1))
    default = signatures["serving_default"](token_ids=tf.constant(token_ids[:1, :2]),
                                            lengths=tf.constant([2], tf.int32))
    np.testing.assert_allclose(default["probabilities"].numpy(), want[:1], atol=1e-5)
    for row, n in enumerate(lengths):  # alone and unpadded: the same
        alone = signatures["classify_document"](token_ids=tf.constant(token_ids[row:row + 1, :n]),
                                                lengths=tf.constant([n], tf.int32))
        np.testing.assert_allclose(alone["probabilities"].numpy()[0], want[row], atol=1e-5)


def test_the_export_traces_the_document_read_once_for_both_signatures(exported):
    # classify_document and classify_text call one traced read (`shared`): an export's time is
    # nearly all tracing, and the SavedModel holds the loop once.
    assert READS == [True]


def test_classify_text_reads_a_text_as_the_data_was_prepared(exported, signatures):
    root, model, path = exported
    texts = [text for text, _ in DOCUMENTS]
    out = signatures["classify_text"](text=tf.constant(texts))
    # The prepared records hold <eod> then the text's ids: what classify_text must read.
    (records, _), = classification_dataset(str(root / "data"), "train", len(texts), T)
    prepared = {tuple(ids[:n]) for ids, n in zip(records[TOKEN_IDS].numpy(),
                                                 records[LENGTHS].numpy())}
    tokenizer = BytesTokenizer()
    framed = [[tokenizer.eod_id, *tokenizer.encode(text)] for text in texts]
    assert {tuple(ids) for ids in framed} == prepared
    lengths = [len(ids) for ids in framed]
    padded = [ids + [0] * (max(lengths) - len(ids)) for ids in framed]
    want = probabilities(model, padded, lengths)
    np.testing.assert_allclose(out["probabilities"].numpy(), want, atol=1e-5)
    assert [label.decode() for label in out["labels"].numpy()] == [
        LABELS[i] for i in want.argmax(axis=1)]
    with open(os.path.join(path, EXPORT_RECORD)) as f:
        assert json.load(f)["labels"] == LABELS


def test_the_bounds_are_2_gib_of_memory_rows_and_request_tokens():
    signatures = ClassifierSignatures(new_classifier(pooling="segment_attention"))
    assert signatures.max_batch_size == 2**31 // ROW_BYTES
    assert signatures.max_tokens == 2**31 // TOKEN_BYTES
    assert ClassifierSignatures(new_classifier()).max_tokens == 2**31 // 9  # no summaries
    assert "classify_text" not in signatures.functions  # no tokenizer


def ids(batch, length):
    return np.ones((batch, length), np.int32)


BAD_REQUESTS = {
    "token_ids rank 1": ("classify_document", dict(token_ids=[1, 2], lengths=[2]),
                         r"classify_document: token_ids must have shape \[B, L\] with B >= 1"),
    "token_ids empty": ("classify_document", dict(token_ids=ids(1, 0), lengths=[1]),
                        r"token_ids must have shape \[B, L\] with B >= 1 and L >= 1"),
    "lengths of another batch": ("classify_document", dict(token_ids=ids(2, 3), lengths=[3]),
                                 r"classify_document: lengths must have shape \[B\] "
                                 r"\(token_ids: \[B, L\]\) =\] \[2\] \[but got\] \[1\]"),
    "length 0": ("classify_document", dict(token_ids=ids(2, 3), lengths=[3, 0]),
                 r"lengths must be in \[1, L\] \(L: the length of token_ids\), but got\] \[3 0\]"),
    "length over L": ("classify_document", dict(token_ids=ids(1, 3), lengths=[4]),
                      r"lengths must be in \[1, L\]"),
    "id V": ("classify_document", dict(token_ids=[[1, V, 1]], lengths=[2]),
             rf"token_ids \(the first lengths\[b\] of row b\) must be token ids in "
             rf"\[0, {V}\), but got ids from\] \[1\] \[to\] \[{V}\]"),
    "id -1": ("classify_document", dict(token_ids=[[-1]], lengths=[1]),
              rf"must be token ids in \[0, {V}\), but got ids from\] \[-1\]"),
    "batch over the bound": ("classify_document",
                             dict(token_ids=ids(MAX_BATCH + 1, 1), lengths=[1] * (MAX_BATCH + 1)),
                             rf"classify_document: B must be in \[1, {MAX_BATCH}\]"),
    "tokens over the bound": ("classify_document",
                              dict(token_ids=ids(1, MAX_TOKENS + 1), lengths=[1]),
                              rf"classify_document: B x L, L rounded up to whole segments of "
                              rf"T={T} \(at least {K}\), must be at most {MAX_TOKENS} tokens"),
    "text rank 0": ("classify_text", dict(text="a"),
                    r"classify_text: text must have shape \[B\] with B >= 1"),
    "text rank 2": ("classify_text", dict(text=[["a"]]), r"text must have shape \[B\]"),
    "empty text": ("classify_text", dict(text=["a", ""]),
                   r"classify_text: text must encode to >= 1 token each"),
    "text over the bound": ("classify_text", dict(text=["a" * MAX_TOKENS]),
                            rf"classify_text: text: B x L.* must be at most {MAX_TOKENS} tokens"),
}


@pytest.fixture(scope="module")
def served(exported):
    session = load_as_served(exported[2])
    yield session
    session[0].close()


@pytest.mark.parametrize("case", BAD_REQUESTS, ids=list(BAD_REQUESTS))
def test_bad_requests_fail_at_the_signature_entry_as_served(served, case):
    """Fed as TF Serving feeds them (no client-side shape check): one InvalidArgumentError from
    the entry checks naming the input, the expectation and what came."""
    assert_refused_at_the_entry(served, *BAD_REQUESTS[case])


def test_what_does_not_fit_is_one_error_line_and_nothing_is_written(exported, tmp_path):
    root, _, path = exported
    model, data = f"--model={root / 'classifier.keras'}", f"--data_dir={root / 'data'}"
    exports = root / "exports"
    before = sorted(os.listdir(exports))
    assert_one_error_line(run_in_process(TOOL, model, f"--output_dir={exports}", "--version=1"),
                          f"{path} already exists")
    assert_one_error_line(run_in_process(TOOL, model, f"--output_dir={exports}", "--tgt_len=8",
                                         "--score_top_k=4"),
                          "--tgt_len, --score_top_k does not apply", "a DocumentClassifier",
                          f"segments of {T} tokens on {M} memory slots")
    new_classifier(num_classes=4).save(tmp_path / "four.keras")
    assert_one_error_line(run_in_process(TOOL, f"--model={tmp_path / 'four.keras'}", data,
                                         f"--output_dir={exports}"),
                          "has 4 classes", "3 labels (cat, dog, eel)")
    assert sorted(os.listdir(exports)) == before


def test_model_export_writes_these_signatures_at_a_path(monkeypatch, tmp_path):
    # What `DocumentClassifier.export` hands to the publication tfxl-export and
    # `TransfoXLLM.export` share (tested with them); no tracing here.
    written = []
    monkeypatch.setattr(classifier_signatures, "publish_at", lambda *args: written.append(args))
    model, tokenizer = new_classifier(), BytesTokenizer()
    model.export(str(tmp_path / "export"), tokenizer=tokenizer, labels=LABELS)
    (signatures, path, verbose), = written
    assert isinstance(signatures, ClassifierSignatures) and signatures.model is model
    assert (path, verbose, signatures.tokenizer, signatures.labels) == (
        str(tmp_path / "export"), None, tokenizer, LABELS)
    assert list(signatures.functions) == ["classify_document", "classify_text"]
    with pytest.raises(ValueError, match="only format='tf_saved_model'"):
        model.export(str(tmp_path / "export"), format="onnx")
    with pytest.raises(ValueError, match="needs the label names"):
        model.export(str(tmp_path / "export"), tokenizer=tokenizer)
    with pytest.raises(ValueError, match="3 classes, but 2 label names"):
        model.export(str(tmp_path / "export"), tokenizer=tokenizer, labels=LABELS[:2])


@pytest.mark.large
def test_the_export_reads_as_the_model_was_trained_unless_told(tmp_path):
    # A classifier saved with its reading (the first 2T tokens, no memory): classify_document
    # reads that way; tfxl-export --max_tokens=0 --reading=memory reads whole documents.
    model = new_classifier(pooling="last", reading="no_memory", max_tokens=2 * T)
    model.save(tmp_path / "c.keras")
    rng = np.random.default_rng(3)
    token_ids, lengths = rng.integers(0, V, (2, 5 * T)).astype("int32"), [5 * T, T + 1]
    for flags, reading, max_tokens in (((), "no_memory", 2 * T),
                                       (("--max_tokens=0", "--reading=memory"), "memory", None)):
        exports = tmp_path / f"exports_{reading}"
        done = run_in_process(TOOL, f"--model={tmp_path / 'c.keras'}", f"--output_dir={exports}",
                              *flags)
        assert done.returncode == 0, done.stderr[-3000:]
        model.set_reading(reading=reading, max_tokens=max_tokens, whole=max_tokens is None)
        out = tf.saved_model.load(str(exports / "1")).signatures["classify_document"](
            token_ids=tf.constant(token_ids), lengths=tf.constant(lengths, tf.int32))
        np.testing.assert_allclose(out["probabilities"].numpy(),
                                   probabilities(model, token_ids, lengths), atol=1e-5)
    lm = tmp_path / "lm.keras"
    tiny_lm().save(lm)
    assert_one_error_line(run_in_process(TOOL, f"--model={lm}", f"--output_dir={tmp_path / 'x'}",
                                         "--max_tokens=8"), "--max_tokens",
                          "DocumentClassifier only")
