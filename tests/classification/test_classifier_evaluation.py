"""evaluate_classifier counts every document of a split exactly once (a short last batch padded
and masked out, with or without a strategy of two replicas), and its loss, accuracy, macro-F1 and
confusion matrix equal an independent numpy computation and a hand-made case."""

import json
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from factories import tiny_config
from tfxl.classification import (ClassifierEvaluator, DocumentClassifier, evaluate_classifier,
                                 metrics_from_confusion)
from tfxl.data.classification import (ClassificationConfig, classification_dataset,
                                      prepare_classification)

T = 4
BATCH = 4  # 11 and 6 documents: a short last batch of 3 and 2 rows


def prepare(root, documents):
    path = root / "train.jsonl"
    path.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in documents))
    prepare_classification(ClassificationConfig(
        output_dir=str(root / "data"), train=[str(path)], valid_fraction=0.0,
        test_fraction=0.0), log=lambda *a: None)
    return str(root / "data")


@pytest.fixture(scope="module")
def eleven_documents(tmp_path_factory):
    rng = np.random.default_rng(3)
    documents = [("".join(rng.choice(list("abcdefgh"), rng.integers(3, 16))), "xyz"[i % 3])
                 for i in range(11)]
    return prepare(tmp_path_factory.mktemp("eleven"), documents)


def on(strategy_name, mirrored, model):
    """`model` itself, or its twin built under the two-replica MirroredStrategy."""
    if strategy_name == "default":
        return model, None
    with mirrored.scope():
        twin = DocumentClassifier.from_config(model.get_config())
    twin.set_weights(model.get_weights())
    return twin, mirrored


def numpy_metrics(logits, labels, num_classes):
    """The metrics from logits and labels, computed directly (no confusion matrix)."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    predicted = logits.argmax(axis=1)
    f1 = {c: 2 * np.sum((predicted == c) & (labels == c))
          / (np.sum(labels == c) + np.sum(predicted == c))
          for c in range(num_classes) if np.any(labels == c) or np.any(predicted == c)}
    return dict(loss=-log_probs[np.arange(len(labels)), labels].mean(),
                accuracy=np.mean(predicted == labels), macro_f1=np.mean(list(f1.values())),
                predicted=predicted)


@pytest.mark.parametrize("strategy_name", ["default", "mirrored"])
def test_every_document_once_and_the_metrics_equal_numpys(eleven_documents, mirrored,
                                                         strategy_name):
    keras.utils.set_random_seed(2)
    reference = DocumentClassifier(tiny_config(vocab_size=258, init_std=0.5), 3, segment_len=T)
    model, strategy = on(strategy_name, mirrored, reference)
    evaluator = ClassifierEvaluator(model, BATCH, strategy)
    got = evaluator(classification_dataset(eleven_documents, "train", BATCH, T))
    # Evaluated again (a training run's next --eval_every): the same, and nothing traced again.
    again = evaluator(classification_dataset(eleven_documents, "train", BATCH, T))
    assert again.to_dict() == got.to_dict()
    assert evaluator.step.experimental_get_tracing_count() == 1
    # All eleven documents in one batch, read eagerly by the single-device model.
    features, labels = next(iter(classification_dataset(eleven_documents, "train", 11, T)))
    labels = labels.numpy()
    want = numpy_metrics(reference(features).numpy(), labels, 3)
    assert len(set(want["predicted"])) > 1 and 0 < want["accuracy"] < 1  # a case that tells
    assert got.documents == 11
    assert got.loss == pytest.approx(want["loss"], abs=1e-6)
    assert got.accuracy == pytest.approx(want["accuracy"], abs=1e-12)
    assert got.macro_f1 == pytest.approx(want["macro_f1"], abs=1e-12)
    expected_confusion = np.zeros((3, 3), np.int64)
    np.add.at(expected_confusion, (labels, want["predicted"]), 1)
    np.testing.assert_array_equal(got.confusion, expected_confusion)


class PredictsTheFirstDigit(keras.Model):
    """Logits 4 · one_hot(d) for a document whose text starts with the digit d."""

    num_classes = 4

    def call(self, features, training=None):
        first = features["token_ids"][:, 1] - ord("0")  # after <eod>; bytes: id = byte
        return 4.0 * tf.one_hot(first, self.num_classes)


# (text, label): rows the true labels 0, 1, 2 (of four classes; none is 3), columns the
# predictions: [[2, 1, 0, 0], [0, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]].
HAND_MADE = [("0 a", "0"), ("0 b", "0"), ("1 c", "0"), ("1 d", "1"), ("2 e", "1"), ("0 f", "2")]
HAND_MADE_CONFUSION = [[2, 1, 0, 0], [0, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]
# F1 per class: 2·2/(3+3), 2·1/(2+2), 0/(1+1); class 3 (no document, no prediction) left out.
HAND_MADE_F1 = [2 / 3, 1 / 2, 0.0, None]


@pytest.mark.parametrize("strategy_name", ["default", "mirrored"])
def test_a_hand_made_case_gives_its_known_f1(tmp_path, mirrored, strategy_name):
    data_dir = prepare(tmp_path, HAND_MADE)
    strategy = mirrored if strategy_name == "mirrored" else None
    got = evaluate_classifier(PredictsTheFirstDigit(), classification_dataset(
        data_dir, "train", BATCH, T), BATCH, strategy)
    assert got.documents == 6
    np.testing.assert_array_equal(got.confusion, HAND_MADE_CONFUSION)
    assert got.per_class_f1 == pytest.approx(HAND_MADE_F1)
    assert got.macro_f1 == pytest.approx((2 / 3 + 1 / 2 + 0) / 3)  # not / 4
    assert got.accuracy == pytest.approx(3 / 6)
    # Each document's loss is log(e^4 + 3) less 4 where it is predicted right (3 of 6).
    assert got.loss == pytest.approx(math.log(math.exp(4) + 3) - 4 * 3 / 6, abs=1e-6)
    assert got.to_dict(["a", "b", "c", "d"])["per_class_f1"]["d"] is None


def test_metrics_from_confusion_alone_and_what_is_refused(mirrored):
    metrics = metrics_from_confusion(HAND_MADE_CONFUSION, loss_sum=3.0)
    assert metrics.per_class_f1 == pytest.approx(HAND_MADE_F1) and metrics.loss == 0.5
    with pytest.raises(ValueError, match="no documents"):
        metrics_from_confusion(np.zeros((2, 2)), 0.0)
    with pytest.raises(ValueError, match="multiple of the strategy's 2 replicas"):
        evaluate_classifier(PredictsTheFirstDigit(), tf.data.Dataset.range(1), 3, mirrored)
