"""Document classification with Transformer-XL: `DocumentClassifier` reads documents
of any length segment by segment on a carried memory, pools what it has read, and classifies.

Layering: the model, its evaluation and its SavedModel signatures
(`tfxl.classification.signatures`) import the model (`tfxl.models`, `tfxl.layers`), never the
trainer, the serving tools or the data package; their data is `tfxl.data.classification`'s,
which only the command-line tool `evaluate_main` (tfxl-classify-eval) reads
(tests/test_layering.py).
"""

import importlib

from tfxl.classification.readings import (LENGTHS, MEMORY, NO_MEMORY, POOLINGS, READINGS,
                                          TOKEN_IDS, TRUNCATION)

# The rest is imported on first use, each from its module. The model and its pooling are Keras:
# the tools' flags take their choices from `readings` alone, and their --help should not wait
# for Keras (tests/test_cli_help.py). The evaluation is TensorFlow code (tf.function, tf.data):
# the model (keras.ops: tfxl.hub's text classifier on every backend) imports without TensorFlow.
_LAZY = {"DocumentClassifier": "classifier", "align_to_last_segment": "classifier",
         "SegmentAttentionPooling": "pooling",
         "ClassificationMetrics": "evaluation", "ClassifierEvaluator": "evaluation",
         "evaluate_classifier": "evaluation", "metrics_from_confusion": "evaluation"}

__all__ = ["ClassificationMetrics", "ClassifierEvaluator", "DocumentClassifier", "LENGTHS",
           "MEMORY", "NO_MEMORY", "POOLINGS", "READINGS", "SegmentAttentionPooling", "TOKEN_IDS",
           "TRUNCATION", "align_to_last_segment",
           "evaluate_classifier", "metrics_from_confusion"]


def __getattr__(name):
    if name in _LAZY:
        module = importlib.import_module(f"tfxl.classification.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'tfxl.classification' has no attribute {name!r}")
