"""Document classification with Transformer-XL (issue #18): `DocumentClassifier` reads documents
of any length segment by segment on a carried memory, pools what it has read, and classifies.

Layering: the model and its evaluation import the model (`tfxl.models`, `tfxl.layers`), never
the trainer or the data package; their data is `tfxl.data.classification`'s, which only the
command-line tool `evaluate_main` (tfxl-classify-eval) reads.
"""

from tfxl.classification.classifier import (LENGTHS, TOKEN_IDS, DocumentClassifier,
                                            align_to_last_segment)
from tfxl.classification.evaluation import (ClassificationMetrics, ClassifierEvaluator,
                                            evaluate_classifier, metrics_from_confusion)
from tfxl.classification.pooling import POOLINGS, SegmentAttentionPooling

__all__ = ["ClassificationMetrics", "ClassifierEvaluator", "DocumentClassifier", "LENGTHS",
           "POOLINGS", "SegmentAttentionPooling", "TOKEN_IDS", "align_to_last_segment",
           "evaluate_classifier", "metrics_from_confusion"]
