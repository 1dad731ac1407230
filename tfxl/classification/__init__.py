"""Document classification with Transformer-XL (issue #18): `DocumentClassifier` reads documents
of any length segment by segment on a carried memory, pools what it has read, and classifies.

Layering: the model, its evaluation and its SavedModel export (`tfxl.classification.export`)
import the model (`tfxl.models`, `tfxl.layers`), never the trainer, the serving tools or the data
package; their data is `tfxl.data.classification`'s, which only the command-line tool
`evaluate_main` (tfxl-classify-eval) reads (tests/test_layering.py).
"""

from tfxl.classification.classifier import (LENGTHS, MEMORY, NO_MEMORY, READINGS, TOKEN_IDS,
                                            TRUNCATION, DocumentClassifier,
                                            align_to_last_segment)
from tfxl.classification.pooling import POOLINGS, SegmentAttentionPooling

# The evaluation is TensorFlow code (tf.function, tf.data): imported on first use, so that the
# model (keras.ops: tfxl.hub's text classifier on every backend) imports without TensorFlow.
_EVALUATION = ("ClassificationMetrics", "ClassifierEvaluator", "evaluate_classifier",
               "metrics_from_confusion")

__all__ = ["ClassificationMetrics", "ClassifierEvaluator", "DocumentClassifier", "LENGTHS",
           "MEMORY", "NO_MEMORY", "POOLINGS", "READINGS", "SegmentAttentionPooling", "TOKEN_IDS",
           "TRUNCATION", "align_to_last_segment",
           "evaluate_classifier", "metrics_from_confusion"]


def __getattr__(name):
    if name in _EVALUATION:
        from tfxl.classification import evaluation
        return getattr(evaluation, name)
    raise AttributeError(f"module 'tfxl.classification' has no attribute {name!r}")
