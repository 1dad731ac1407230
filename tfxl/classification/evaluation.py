"""A document classifier evaluated over every document of a split: the loss (the mean
cross-entropy over documents), accuracy, macro-F1 and the confusion matrix.

Every document counts exactly once. Each batch is padded to `batch_size` rows (a short last batch
too) with rows of weight 0 that count nowhere, so every step has the same number of rows and,
under a `tf.distribute` strategy of R replicas, each replica gets batch_size / R of them (none an
empty or uneven share). A replica adds up the loss and a confusion matrix of its rows, weighted;
the replicas' sums are reduced once per step, and the metrics come from the summed confusion
matrix on the host (`metrics_from_confusion`).

Macro-F1 is the mean of the per-class F1 = 2 TP / (2 TP + FP + FN) over the classes that have a
document in the split or a prediction. A class with neither has no F1 (0/0: None in
`per_class_f1`) and is left out of the mean, as scikit-learn's `f1_score` does when it is not
given the labels: scoring it 0 would lower the score for what the split lacks, not for any
error of the model (scoring it 1 would raise it). A class with documents and no correct
prediction scores 0.

Layering: this module reads batches as `tfxl.data.classification.classification_dataset` makes
them (the feature names are the classifier's); it imports neither the data package nor the
trainer.
"""

from __future__ import annotations

import dataclasses
import time
from typing import List, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf
from keras import ops


@dataclasses.dataclass
class ClassificationMetrics:
    """The result of an evaluation (module docstring for the F1 rule).

    confusion: int64 [C, C], rows the true labels, columns the predictions.
    """

    loss: float
    accuracy: float
    macro_f1: float
    per_class_f1: List[Optional[float]]
    confusion: np.ndarray
    documents: int

    def to_dict(self, label_names: Optional[Sequence[str]] = None) -> dict:
        """JSON-ready: floats, lists, and the label names (default "0", "1", ...)."""
        names = list(label_names or map(str, range(len(self.per_class_f1))))
        return {"loss": self.loss, "accuracy": self.accuracy, "macro_f1": self.macro_f1,
                "documents": self.documents, "labels": names,
                "per_class_f1": dict(zip(names, self.per_class_f1)),
                "confusion": self.confusion.tolist()}


def metrics_from_confusion(confusion, loss_sum: float) -> ClassificationMetrics:
    """The metrics of a confusion matrix [C, C] (rows true labels, columns predictions) and the
    documents' summed cross-entropy."""
    confusion = np.asarray(confusion, np.int64)
    documents = int(confusion.sum())
    if documents == 0:
        raise ValueError("no documents were evaluated (an empty split?)")
    hits = np.diag(confusion)
    # Per class 2 TP + FP + FN = (TP + FN) + (TP + FP): its documents plus its predictions.
    denominators = confusion.sum(axis=1) + confusion.sum(axis=0)
    per_class_f1 = [float(2 * hit / d) if d else None for hit, d in zip(hits, denominators)]
    return ClassificationMetrics(
        loss=float(loss_sum / documents), accuracy=float(hits.sum() / documents),
        macro_f1=float(np.mean([f1 for f1 in per_class_f1 if f1 is not None])),
        per_class_f1=per_class_f1, confusion=confusion, documents=documents)


def padded_batches(dataset: tf.data.Dataset, batch_size: int) -> tf.data.Dataset:
    """(features, labels) batches of at most `batch_size` rows -> (features, labels, weights)
    of exactly `batch_size` rows: the rows added are all-padding documents of length 0 and weight
    0 (weights float32 [batch_size], 1 for a document). A larger batch is an error."""

    def pad(features, labels):
        rows = tf.shape(labels)[0]
        fits = tf.debugging.assert_less_equal(
            rows, batch_size, message=f"evaluation: a batch has more than batch_size="
            f"{batch_size} rows (give the batch size the dataset was made with)")
        with tf.control_dependencies([fits]):
            missing = batch_size - rows

        def pad_rows(x):
            x = tf.pad(x, [[0, missing]] + [[0, 0]] * (x.shape.rank - 1))
            return tf.ensure_shape(x, [batch_size, *x.shape[1:]])

        weights = pad_rows(tf.ones_like(labels, tf.float32))
        return {name: pad_rows(x) for name, x in features.items()}, pad_rows(labels), weights

    return dataset.map(pad)


def evaluate_classifier(model, dataset: tf.data.Dataset, batch_size: int,
                        strategy: Optional[tf.distribute.Strategy] = None,
                        progress=None) -> ClassificationMetrics:
    """Evaluates `model` (a `DocumentClassifier`, or any model of `num_classes` logits on these
    features) on every document of `dataset`, once.

    dataset: (features, labels) batches of at most `batch_size` rows, as
      `classification_dataset(..., batch_size)` yields them (its last batch may be shorter).
    strategy: the model's (built under its scope); default the current one. batch_size must be
      a multiple of its replicas.
    progress: called after each batch with (documents so far, seconds since the start).
    """
    return ClassifierEvaluator(model, batch_size, strategy)(dataset, progress)


class ClassifierEvaluator:
    """`evaluate_classifier` whose step is traced once and reused for every dataset of the same
    element spec: a training run evaluates every --eval_every steps without tracing again."""

    def __init__(self, model, batch_size: int,
                 strategy: Optional[tf.distribute.Strategy] = None):
        self.model, self.batch_size = model, batch_size
        self.strategy = strategy = strategy or tf.distribute.get_strategy()
        replicas = strategy.num_replicas_in_sync
        if batch_size < 1 or batch_size % replicas:
            raise ValueError(f"evaluation: batch_size={batch_size} must be a positive multiple "
                             f"of the strategy's {replicas} replicas")
        self.step = tf.function(self._step)

    def _replica_sums(self, features, labels, weights):
        num_classes = self.model.num_classes
        logits = self.model(features, training=False)
        nll = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        counted = weights > 0
        loss_sum = ops.sum(ops.where(counted, nll, 0.0))  # a padding row's NaN stays out too
        true = ops.one_hot(labels, num_classes) * weights[:, None]
        predicted = ops.one_hot(ops.argmax(logits, axis=-1), num_classes)
        return loss_sum, ops.matmul(ops.transpose(true), predicted), ops.sum(weights)

    def _step(self, batch):
        sums = self.strategy.run(self._replica_sums, args=batch)
        return [self.strategy.reduce(tf.distribute.ReduceOp.SUM, s, axis=None) for s in sums]

    def __call__(self, dataset: tf.data.Dataset, progress=None) -> ClassificationMetrics:
        num_classes = self.model.num_classes
        distributed = self.strategy.experimental_distribute_dataset(
            padded_batches(dataset, self.batch_size))  # every batch batch_size rows: one trace
        loss_sum, confusion, documents = 0.0, np.zeros((num_classes, num_classes), np.int64), 0
        start = time.perf_counter()
        for batch in distributed:
            batch_loss, batch_confusion, batch_documents = self.step(batch)
            loss_sum += float(batch_loss)  # float64 across batches
            confusion += np.rint(batch_confusion.numpy()).astype(np.int64)
            documents += int(round(float(batch_documents)))
            if progress is not None:
                progress(documents, time.perf_counter() - start)
        if int(confusion.sum()) != documents:  # one_hot of a label outside [0, C) is all zeros
            raise ValueError(f"evaluation: {documents - int(confusion.sum())} of {documents} "
                             f"documents have a label outside the model's {num_classes} classes")
        return metrics_from_confusion(confusion, loss_sum)
