"""A Transformer-XL document classifier: reads documents of any length segment by segment on a
carried memory, pools what it has read, and classifies.

Shape glossary: B batch (documents), L padded document length (tokens), T segment length,
S segments read (ceil(L / T), at least K), K `grad_segments`, M memory length (slots), D model
size, C classes. (The backbone's layer count is never a dimension here.)

Reading. The input is right-padded: token ids [B, L] and each document's length [B]. Each row is
first moved right so that the document starts at a segment boundary and ends in the last
segment S - 1 (`align_to_last_segment`); the segments before it are all padding. Then the S
segments are read in order on a layer-input memory of M slots: padding is masked as the backbone
masks it (`segment_valid`: no query attends to it, the memory marks its slots invalid), so an
all-padding segment leaves the memory empty, and every document is read exactly as if it were
alone and unpadded. Aligning the ends (rather than the starts) gives every row its own last
segment at the same index: the last position, the last segment's mean and the segments read with
gradient are the same positions for every row, and no row spends its gradient window on padding.

Gradient reach (`grad_segments` = K). Transformer-XL trains with the memory under stop-gradient,
which bounds a step's activations to one segment. A classifier's loss sits at the end of the
document, so with the stop-gradient only the last segment's tokens would learn anything from it
directly. Here the last K segments are read with the gradient flowing through the memory between
them (`TransfoXLBackbone(memory_gradient=True)`): the loss reaches the tokens of the last K
segments (as far back as the memory of M slots reaches: choose M >= T for a full window). The
S - K segments before are read in a `keras.ops.fori_loop` whose results (the memory and the
segment summaries) leave it under stop-gradient: nothing inside it is on a path to the loss, so no
backward pass is built for it and the activation memory of a training step is that of K segments
whatever the document's length; the earlier segments still shape the logits through the memory
and (attention pooling) their summaries. Under TensorFlow this holds for compiled steps
(`tf.function`, what `fit` and the trainer run): eagerly, a `GradientTape` keeps what the loop's
ops touch, though their gradient is still zero. K = 1 is the cheapest and already trains every
weight; a larger K lets the loss teach the model what to carry across segment boundaries.

Poolings (`pooling=`, `tfxl.classification.pooling`): "last" the state at the last valid position
(it has attended to everything the memory holds); "last_segment_mean" the mean of the last
segment's valid states; "segment_attention" a learned query's attention over one summary per
segment (the mean of its valid states), all S of them.
"""

import sys

import keras
from keras import ops

from tfxl.classification.pooling import (SegmentAttentionPooling, check_pooling,
                                         last_valid_state, valid_mean)
# The readings', poolings' and inputs' names, where the tools' flags take them from.
from tfxl.classification.readings import (LAST, LAST_SEGMENT_MEAN, LENGTHS, MEMORY, NO_MEMORY,
                                          READINGS, SEGMENT_ATTENTION, TOKEN_IDS, TRUNCATION)
from tfxl.config import TransfoXLConfig
from tfxl.layers.transformer_xl_block import attention_class
from tfxl.models.backbone import TransfoXLBackbone, as_config, default_name


def _dim(x, axis):
    return x.shape[axis] if x.shape[axis] is not None else ops.shape(x)[axis]


def align_to_last_segment(token_ids, lengths, segment_len, min_segments=1):
    """Right-padded documents -> (segments [B, S, T], valid [B, S, T] bool): each document starts
    at a segment boundary and ends in segment S - 1, with S = max(ceil(L / T), min_segments).

    lengths: int [B] (None: every row is L tokens); clipped to [0, L]. Padding reads as token 0,
    masked by `valid`.
    """
    length = _dim(token_ids, 1)
    if isinstance(length, int):
        num_segments = max(-(-length // segment_len), min_segments)
    else:
        num_segments = ops.maximum((length + segment_len - 1) // segment_len, min_segments)
    if lengths is None:
        lengths = ops.full((_dim(token_ids, 0),), length, dtype="int32")
    lengths = ops.clip(ops.cast(lengths, "int32"), 0, length)
    used = (lengths + segment_len - 1) // segment_len  # segments each document fills
    shift = (num_segments - used) * segment_len       # [B]: where each document starts
    source = ops.arange(num_segments * segment_len, dtype="int32")[None, :] - shift[:, None]
    valid = ops.logical_and(source >= 0, source < lengths[:, None])
    ids = ops.take_along_axis(token_ids, ops.clip(source, 0, length - 1), axis=1)
    ids = ops.where(valid, ids, ops.zeros((), ids.dtype))
    shape = (-1, num_segments, segment_len)
    return ops.reshape(ids, shape), ops.reshape(valid, shape)


@keras.saving.register_keras_serializable(package="tfxl")
class DocumentClassifier(keras.Model):
    """A `TransfoXLBackbone` that reads whole documents, a pooling, and a linear head.

    Args:
      config: the backbone's `TransfoXLConfig` (or its dict).
      num_classes: C.
      pooling: "last", "last_segment_mean" or "segment_attention" (module docstring).
      grad_segments: K >= 1, the trailing segments read with gradient (module docstring).
      segment_len: T (default config.tgt_len). mem_len: M (default config.mem_len).
      head_dropout: dropout rate on the pooled features.
      reading: how a document is read (`READINGS`): "memory" (module docstring), "no_memory"
        (each T-token segment read alone on an empty memory, pooled and classified; the logits
        are the log of the mean of the non-empty segments' probabilities, so softmax gives that
        mean; every segment read with gradient) or "truncation" (the first `max_tokens` tokens,
        default T, read as "memory" reads).
      max_tokens: the tokens of each document read (its first; None: the whole document, for
        "truncation" T). Saved with the model: evaluation and serving read as it was trained
        (`set_reading` changes it).
      backbone: optional, a built `TransfoXLBackbone` of `config` to read with, shared rather
        than created (not serialised: the owner recreates it; `tfxl.hub`'s text classifier
        shares its keras-hub backbone's this way).
    Call:
      inputs: {"token_ids": int [B, L], "lengths": int [B]} (right-padded documents; L any
        length, the reader makes it a multiple of T), or token ids alone (every row L tokens).
      key_value_memory: read on the key/value memory (inference; see `read`).
    Returns:
      logits [B, C] float32.
    The backbone's clamp_len and same_length are the config's (training) values.

    Examples:

    ```python
    import numpy as np
    import tfxl
    from tfxl.classification import DocumentClassifier

    lm = tfxl.TransfoXLLM(tfxl.get_preset("tiny", vocab_size=258))
    model = DocumentClassifier.from_language_model(lm, num_classes=3,
                                                   pooling="segment_attention")
    token_ids = np.random.default_rng(0).integers(0, 258, size=(2, 200))  # right-padded
    logits = model({"token_ids": token_ids, "lengths": np.array([200, 90])})  # [2, 3]
    ```
    """

    def __init__(self, config, num_classes, pooling=LAST, grad_segments=1, segment_len=None,
                 mem_len=None, head_dropout=0.0, attention_cls=None, backbone=None, name=None,
                 reading=MEMORY, max_tokens=None, **kwargs):
        super().__init__(name=name or default_name("document_classifier"), **kwargs)
        self.config = as_config(config)
        if backbone is not None:
            if backbone.config != self.config:
                raise ValueError("DocumentClassifier: the given backbone has another config")
            attention_cls, self.backbone = backbone.attention_cls, backbone
        self.num_classes = int(num_classes)
        self.pooling = check_pooling(pooling)
        self.grad_segments = int(grad_segments)
        self.segment_len = int(self.config.tgt_len if segment_len is None else segment_len)
        self.mem_len = int(self.config.mem_len if mem_len is None else mem_len)
        self.head_dropout = float(head_dropout)
        self.attention_cls = attention_class(attention_cls)
        self.set_reading(reading=reading, max_tokens=max_tokens)
        for what, value, least in (("num_classes", self.num_classes, 2),
                                   ("grad_segments", self.grad_segments, 1),
                                   ("segment_len", self.segment_len, 1),
                                   ("mem_len", self.mem_len, 0)):
            if value < least:
                raise ValueError(f"DocumentClassifier: {what} must be >= {least}, got {value}")
        if not 0.0 <= self.head_dropout < 1.0:
            raise ValueError(f"DocumentClassifier: head_dropout must be in [0, 1), got "
                             f"{self.head_dropout}")
        self.build((None, None))  # no weight's shape depends on the input

    def build(self, input_shape=None):
        if self.built:  # built by __init__; Keras and callers may ask again
            return
        c, policy = self.config, self.dtype_policy
        if not hasattr(self, "backbone"):  # else given, built
            self.backbone = TransfoXLBackbone(c, attention_cls=self.attention_cls,
                                              name="backbone", dtype=policy)
            self.backbone.build((None, self.segment_len))
        if self.pooling == SEGMENT_ATTENTION:
            self.segment_attention = SegmentAttentionPooling(c.init_std, name="segment_attention",
                                                             dtype=policy)
            self.segment_attention.build((None, None, c.d_model))
        self.dropout = keras.layers.Dropout(self.head_dropout, name="head_dropout", dtype=policy)
        self.head = keras.layers.Dense(
            self.num_classes, kernel_initializer=keras.initializers.RandomNormal(
                stddev=c.init_std), name="head", dtype=policy)
        self.head.build((None, c.d_model))
        self.built = True

    @classmethod
    def from_language_model(cls, lm_or_path, num_classes, checkpoint=None, **kwargs):
        """A classifier whose backbone is a tfxl language model's, with a fresh head.

        lm_or_path: a `TransfoXLLM`, or where one is: a `.keras` file (tfxl-convert's output of
          a published checkpoint too) or a tfxl-train model_dir (its newest readable checkpoint,
          or `checkpoint`), local or gs://, loaded by
          `tfxl.checkpoints.loading.load_language_model`.
        kwargs: the classifier's own arguments (pooling, grad_segments, ...); the backbone's
          config and attention class are the language model's.
        """
        lm = lm_or_path
        if isinstance(lm_or_path, str):
            # Imported here: loading reads model_dirs and checkpoints with TensorFlow, and the
            # classifier needs it only to find a language model's weights.
            from tfxl.checkpoints.loading import load_language_model
            lm = load_language_model(lm_or_path, checkpoint=checkpoint)
        classifier = cls(lm.config, num_classes, attention_cls=lm.attention_cls, **kwargs)
        classifier.backbone.set_weights(lm.backbone.get_weights())
        return classifier

    # -- reading --------------------------------------------------------------------------------
    def set_reading(self, *, reading=None, max_tokens=None, whole=False):
        """Sets how documents are read (`reading`, `max_tokens`: the constructor's; None keeps
        the current one; whole=True: whole documents, max_tokens None). Read when a call is
        traced: evaluation and an export read this way; `get_config` saves it."""
        if reading is not None:
            if reading not in READINGS:
                raise ValueError(f"reading must be one of {', '.join(READINGS)}, got "
                                 f"{reading!r}")
            self.reading = reading
        if whole:
            self.max_tokens = None
        elif max_tokens is not None:
            if int(max_tokens) < 1:
                raise ValueError(f"DocumentClassifier: max_tokens must be >= 1 (or None: whole "
                                 f"documents), got {max_tokens}")
            self.max_tokens = int(max_tokens)
        elif not hasattr(self, "max_tokens"):
            self.max_tokens = None

    @property
    def tokens_read(self):
        """The tokens of each document read (its first), or None: the whole document."""
        if self.max_tokens is None and self.reading == TRUNCATION:
            return self.segment_len
        return self.max_tokens

    def first_tokens(self, token_ids, lengths=None):
        """(token_ids, lengths) cut to the first `tokens_read` tokens (the columns to whole
        segments of T); unchanged when documents are read whole."""
        n = self.tokens_read
        if n is None:
            return token_ids, lengths
        columns = -(-n // self.segment_len) * self.segment_len
        if lengths is None:
            lengths = ops.full((_dim(token_ids, 0),), _dim(token_ids, 1), dtype="int32")
        if not isinstance(token_ids.shape[1], int) or token_ids.shape[1] > columns:
            token_ids = token_ids[:, :columns]
        return token_ids, ops.minimum(ops.cast(lengths, "int32"), n)

    def read(self, token_ids, lengths=None, training=None, key_value_memory=False,
             mem_len=None):
        """Reads the documents. Returns (hidden [B, T, D] of the last segment, its valid [B, T],
        segment summaries [B, S, D] and their valid [B, S]; the summaries are None unless the
        pooling uses them).

        key_value_memory: read on the key/value memory (inference: each segment projects only
        its own T keys and values, not the M remembered rows again, and writes them into a
        `KeyValueRing` in place of the oldest; no gradient flows through it). With the same
        weights it holds what the layer-input memory would be projected to, so the logits are
        the same (tested to 1e-5); the serving signatures read this way.
        """
        K = self.grad_segments if mem_len != 0 else 1  # alone: one segment, nothing before
        mem_len = self.mem_len if mem_len is None else mem_len
        segments, valid = align_to_last_segment(token_ids, lengths, self.segment_len, K)
        num_segments = _dim(segments, 1)
        run = {}
        if key_value_memory:
            memory = self.backbone.init_key_value_ring(_dim(segments, 0), self.segment_len,
                                                       mem_len)
            run["position_keys"] = self.backbone.position_keys(mem_len + self.segment_len)
        else:
            memory = self.backbone.init_memory(_dim(segments, 0), mem_len)
        summarise = self.pooling == SEGMENT_ATTENTION

        def read_segment(s, memory, gradient):
            segment_valid = ops.take(valid, s, axis=1)
            hidden, memory = self.backbone(ops.take(segments, s, axis=1), memory,
                                           training=training, segment_valid=segment_valid,
                                           memory_gradient=gradient, **run)
            return hidden, segment_valid, memory

        def read_without_gradient(s, carry):
            hidden, segment_valid, carry["memory"] = read_segment(s, carry["memory"], False)
            if summarise:
                summary = valid_mean(hidden, segment_valid)[0]
                carry["summaries"] = ops.slice_update(carry["summaries"], (0, s, 0),
                                                      summary[:, None, :])
            return carry

        carry = {"memory": memory}
        if summarise:
            carry["summaries"] = ops.zeros((_dim(segments, 0), num_segments - K,
                                            self.config.d_model), self.compute_dtype)
        if not isinstance(num_segments, int) or num_segments > K:
            carry = ops.fori_loop(0, num_segments - K, read_without_gradient, carry)
            # What leaves the loop carries no gradient: no backward pass is built for the loop.
            carry = keras.tree.map_structure(ops.stop_gradient, carry)
        memory, summaries = carry["memory"], [carry["summaries"]] if summarise else []
        for j in range(K):
            # Gradient through the memory between the last K segments (not out of the last).
            hidden, segment_valid, memory = read_segment(num_segments - K + j, memory, j < K - 1)
            if summarise:
                summaries.append(valid_mean(hidden, segment_valid)[0][:, None, :])
        if not summarise:
            return hidden, segment_valid, None, None
        return (hidden, segment_valid, ops.concatenate(summaries, axis=1),
                ops.any(valid, axis=2))

    def features(self, inputs, training=None, key_value_memory=False):
        """The pooled features [B, D] of `inputs` (as `call` takes them), read on the memory
        (the "no_memory" reading pools each segment alone: `call`)."""
        token_ids, lengths = (inputs[TOKEN_IDS], inputs.get(LENGTHS)) if isinstance(
            inputs, dict) else (inputs, None)
        return self._pool(*self.first_tokens(token_ids, lengths), training, key_value_memory)

    def _pool(self, token_ids, lengths, training, key_value_memory, mem_len=None):
        hidden, valid, summaries, summary_valid = self.read(token_ids, lengths, training,
                                                            key_value_memory, mem_len)
        if self.pooling == LAST:
            return last_valid_state(hidden, valid)
        if self.pooling == LAST_SEGMENT_MEAN:
            return valid_mean(hidden, valid)[0]
        return self.segment_attention(summaries, summary_valid)

    def _logits(self, pooled, training):
        return ops.cast(self.head(self.dropout(pooled, training=training)), "float32")

    def _segments_alone(self, token_ids, lengths, training):
        """The "no_memory" reading: logits [B, C] = log of the mean, over each document's
        non-empty T-token segments, of the probabilities of each segment read alone (a document
        without a token: uniform)."""
        T, C = self.segment_len, self.num_classes
        segments, valid = align_to_last_segment(token_ids, lengths, T)  # [B, S, T]: its own
        num_segments = _dim(segments, 1)
        segment_lengths = ops.sum(ops.cast(valid, "int32"), axis=2)  # [B, S]
        pooled = self._pool(ops.reshape(segments, (-1, T)), ops.reshape(segment_lengths, (-1,)),
                            training, False, mem_len=0)
        probabilities = ops.reshape(ops.softmax(self._logits(pooled, training)),
                                    (-1, num_segments, C))
        used = ops.cast(segment_lengths > 0, "float32")[:, :, None]
        count = ops.sum(used, axis=1)
        mean = ops.sum(probabilities * used, axis=1) / ops.maximum(count, 1.0)
        mean = ops.where(count > 0, mean, 1.0 / C)
        return ops.log(ops.maximum(mean, 1e-30))

    def call(self, inputs, training=None, key_value_memory=False):
        token_ids, lengths = (inputs[TOKEN_IDS], inputs.get(LENGTHS)) if isinstance(
            inputs, dict) else (inputs, None)
        token_ids, lengths = self.first_tokens(token_ids, lengths)
        if self.reading == NO_MEMORY:  # no memory: the key/value one is not needed either
            return self._segments_alone(token_ids, lengths, training)
        return self._logits(self._pool(token_ids, lengths, training, key_value_memory),
                            training)

    def compute_output_spec(self, inputs, training=None, key_value_memory=False):
        token_ids = inputs[TOKEN_IDS] if isinstance(inputs, dict) else inputs
        return keras.KerasTensor((token_ids.shape[0], self.num_classes), "float32")

    def fit(self, x=None, y=None, *args, shuffle=None, **kwargs):
        """`keras.Model.fit`. `shuffle` defaults to Keras' True for arrays, and for a
        `tf.data.Dataset` to its own order (Keras ignores `shuffle` there, with a warning:
        `classification_dataset(..., shuffle=True)` is what shuffles it)."""
        if shuffle is None:
            tf = sys.modules.get("tensorflow")
            shuffle = not (tf is not None and isinstance(x, tf.data.Dataset))
        return super().fit(x, y, *args, shuffle=shuffle, **kwargs)

    def export(self, filepath, format="tf_saved_model", verbose=None, input_signature=None,
               tokenizer=None, labels=None):
        """A SavedModel at `filepath` with the classifier's serving signatures: classify_document
        (= serving_default) and, with `tokenizer` and the C label names `labels`, classify_text
        (`tfxl.classification.signatures`). Never over an existing file or non-empty directory;
        only format="tf_saved_model" and input_signature=None (the signatures fix their own)."""
        if format != "tf_saved_model" or input_signature is not None:
            raise ValueError("DocumentClassifier.export: only format='tf_saved_model' with "
                             "input_signature=None (the signatures fix their own inputs)")
        # Imported here: the export is TensorFlow code (tf.function, tf.saved_model), and the
        # classifier runs on every Keras backend.
        from tfxl.classification.signatures import export_classifier_at
        export_classifier_at(self, filepath, verbose, tokenizer, labels)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict(),
                "num_classes": self.num_classes, "pooling": self.pooling,
                "grad_segments": self.grad_segments, "segment_len": self.segment_len,
                "mem_len": self.mem_len, "head_dropout": self.head_dropout,
                "reading": self.reading, "max_tokens": self.max_tokens,
                "attention_cls": keras.saving.get_registered_name(self.attention_cls)}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        model_config = TransfoXLConfig.from_dict(config.pop("config"))
        return cls(model_config, **config)
