"""`TransfoXLTextClassifier`: keras-hub's TextClassifier (fit on strings, presets) for documents
of any length, read by tfxl's `DocumentClassifier`.

Shape glossary: B batch (documents), L padded document length (tokens), C classes.

    from tfxl.hub import TransfoXLTextClassifier
    classifier = TransfoXLTextClassifier.from_preset("presets/lm", num_classes=3)  # a new head
    classifier.fit(texts, labels)                 # strings and label ids in [0, C)
    classifier.save_to_preset("presets/topics")   # later: from_preset("presets/topics")

Its backbone is the language model's `TransfoXLHubBackbone`, so any tfxl keras-hub LM preset
(`TransfoXLCausalLM.save_to_preset`) starts one: `from_preset(lm_preset, num_classes=C)` loads the
LM's weights and tokenizer and a fresh head (keras-hub loads no task weights when num_classes is
given); `keras_hub.models.TextClassifier.from_preset` finds this class from the backbone.
"""

import keras
from keras import ops
from keras_hub.models import TextClassifier, TextClassifierPreprocessor

from tfxl.backend import require_tensorflow
from tfxl.classification.classifier import DocumentClassifier
from tfxl.classification.readings import LAST, LENGTHS, TOKEN_IDS
from tfxl.hub.backbone import TransfoXLHubBackbone
from tfxl.hub.presets import save_preset
from tfxl.hub.tokenizer import TransfoXLTokenizer
from tfxl.private_apis import preprocessing_function


@keras.saving.register_keras_serializable(package="tfxl")
class TransfoXLTextClassifierPreprocessor(TextClassifierPreprocessor):
    """Texts -> {"token_ids": int32 [B, L], "padding_mask": bool [B, L]} (labels and sample
    weights passed through), each text framed as tfxl-prepare-classification frames a document:
    `<eod>`, then the tokenizer's ids, right-padded with `<pad>`.

    sequence_length: None (the default) pads to the batch's longest document, so documents of
    any length are read whole; a number keeps each document's first `sequence_length` tokens
    (`<eod>` included) and pads to exactly that (static shapes for XLA/TPUs), as the data
    reader's `max_tokens`/`pad_to_max_tokens`. One segment of text per example (keras-hub's
    multi-segment packing does not apply: a document is one sequence).
    """

    backbone_cls = TransfoXLHubBackbone
    tokenizer_cls = TransfoXLTokenizer

    def __init__(self, tokenizer, sequence_length=None, **kwargs):
        kwargs.pop("truncate", None)  # keras-hub's multi-segment option: not ours
        super().__init__(tokenizer, sequence_length=sequence_length, **kwargs)

    def build(self, input_shape):
        self.built = True  # no packer: `call` frames and pads itself

    @preprocessing_function
    def call(self, x, y=None, sample_weight=None):
        if isinstance(x, tuple):
            if len(x) != 1:
                raise ValueError(f"TransfoXLTextClassifierPreprocessor takes one text per "
                                 f"example, got {len(x)} segments")
            x = x[0]
        tf = require_tensorflow("TransfoXLTextClassifierPreprocessor")  # tf.data, ragged tensors
        x = tf.convert_to_tensor(x)
        unbatched = x.shape.rank == 0
        ids = self.tokenizer(x[None] if unbatched else x)
        if not isinstance(ids, tf.RaggedTensor):  # keras-hub's Python path (eager): lists
            ids = tf.ragged.constant(ids, dtype=tf.int32, ragged_rank=1)
        eod = tf.fill([ids.nrows(), 1], tf.cast(self.tokenizer.start_token_id, ids.dtype))
        ids = tf.concat([tf.RaggedTensor.from_tensor(eod), ids], axis=1)
        length = self.sequence_length
        if length is not None:
            ids = ids[:, :length]
        token_ids = ids.to_tensor(self.tokenizer.pad_token_id, shape=[None, length])
        padding_mask = tf.sequence_mask(ids.row_lengths(), tf.shape(token_ids)[1])
        if unbatched:
            token_ids, padding_mask = token_ids[0], padding_mask[0]
        x = {"token_ids": tf.cast(token_ids, tf.int32), "padding_mask": padding_mask}
        return keras.utils.pack_x_y_sample_weight(x, y, sample_weight)

    def save_to_preset(self, preset_dir):
        """keras-hub's `save_to_preset`, into a local directory or a bucket
        (`tfxl.hub.presets`)."""
        save_preset(super().save_to_preset, preset_dir)


@keras.saving.register_keras_serializable(package="tfxl")
class TransfoXLTextClassifier(TextClassifier):
    """Transformer-XL document classification as a keras-hub `TextClassifier`.

    Calling it gives logits [B, C] of a `tfxl.classification.DocumentClassifier` that reads with
    the backbone's own `TransfoXLBackbone` (shared, not copied: fine-tuning trains the
    backbone's weights): every document whole, segment by segment on a memory, its length the
    count of its `padding_mask` (right padding, as the preprocessor makes it). `compile()`'s
    defaults are keras-hub's (Adam 5e-5, sparse cross-entropy from logits, accuracy).

    Args:
      backbone: a `TransfoXLHubBackbone` (a language model's).
      num_classes: C.
      preprocessor: a `TransfoXLTextClassifierPreprocessor` or None (then the model takes
        {"token_ids", "padding_mask"}).
      pooling, grad_segments, segment_len, mem_len, head_dropout: the `DocumentClassifier`'s.
    """

    backbone_cls = TransfoXLHubBackbone
    preprocessor_cls = TransfoXLTextClassifierPreprocessor

    def __init__(self, backbone, num_classes, preprocessor=None, pooling=LAST, grad_segments=1,
                 segment_len=None, mem_len=None, head_dropout=0.0, **kwargs):
        # === Layers ===
        self.backbone = backbone
        self.preprocessor = preprocessor
        # The language model's output layer is never read here: not trained (and no Keras
        # warning that it gets no gradient).
        backbone.language_model.softmax.trainable = False
        self.classifier = DocumentClassifier(
            backbone.config, num_classes, pooling=pooling, grad_segments=grad_segments,
            segment_len=segment_len, mem_len=mem_len, head_dropout=head_dropout,
            backbone=backbone.language_model.backbone, dtype=backbone.dtype_policy,
            name="document_classifier")
        # === Functional model ===
        inputs = backbone.input
        lengths = ops.sum(ops.cast(inputs["padding_mask"], "int32"), axis=1)
        logits = self.classifier({TOKEN_IDS: inputs["token_ids"], LENGTHS: lengths})
        super().__init__(inputs=inputs, outputs=logits, **kwargs)
        # === Config ===
        self.num_classes = self.classifier.num_classes

    def save_to_preset(self, preset_dir, max_shard_size=10):
        """keras-hub's `save_to_preset`, into a local directory or a bucket
        (`tfxl.hub.presets`)."""
        save_preset(super().save_to_preset, preset_dir, max_shard_size=max_shard_size)

    def get_config(self):
        c = self.classifier
        return {**super().get_config(), "num_classes": c.num_classes, "pooling": c.pooling,
                "grad_segments": c.grad_segments, "segment_len": c.segment_len,
                "mem_len": c.mem_len, "head_dropout": c.head_dropout}
