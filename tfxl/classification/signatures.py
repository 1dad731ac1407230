"""SavedModel export of a `DocumentClassifier` for TF Serving: whole documents in, class
probabilities out, stateless (every request is complete).

Shape glossary: B batch (documents), L padded document length (tokens), C classes; T, M and K
are the classifier's segment length, memory length and `grad_segments`.

Signatures:
  classify_document (= serving_default): token_ids int32 [B, L], lengths int32 [B]
      -> probabilities float32 [B, C], label_ids int32 [B] (the most probable class).
      Right-padded documents, as `tfxl.data.classification` batches them: row b's document is
      token_ids[b, :lengths[b]], framed as prepared (<eod> first); what follows it is padding,
      any value, never read. Documents of any length: read segment by segment (T tokens) on the
      key/value memory of M slots in one in-graph loop (`DocumentClassifier.read` with
      key_value_memory=True), as `DocumentClassifier` reads them (the same probabilities).
With a tokenizer and the label names (a tfxl-prepare-classification data dir):
  classify_text: text string [B] -> labels string [B] (the most probable class's name),
      label_ids int32 [B], probabilities float32 [B, C]. A text is framed as
      tfxl-prepare-classification frames a document: <eod>, then the tokenizer's ids of the text.
The label names are also recorded in assets.extra/tfxl_data.json (`labels`, index = class id).

Entry checks (`tfxl.saved_model.request_checks`), one InvalidArgumentError naming the input:
token_ids of rank 2 with B, L >= 1; lengths of shape [B] with every length in [1, L]; a
document's ids (its first lengths[b]) in [0, V); text of shape [B], each encoding to >= 1 token;
B at most `max_batch_size` (its key/value memory of at most 2 GiB, as the language model's
signatures) and B x L, L rounded up to whole segments (at least K), at most `max_tokens` (the
request's per-token working tensors of at most 2 GiB).
"""

import tensorflow as tf

from tfxl.classification.readings import LENGTHS, SEGMENT_ATTENTION, TOKEN_IDS
from tfxl.models.signatures import key_value_memory_row_bytes
from tfxl.saved_model.publish import publish_at, publish_version
from tfxl.saved_model.request_checks import (checked, ids_rule, padded_shape, range_rule,
                                             shape_rule, tokens_rule)
from tfxl.saved_model.signature_set import SignatureSet, most_that_fit, shared, signature


def request_token_bytes(classifier):
    """Bytes per token of a request's working tensors that grow with B x L: the ids received
    (int32), their end-aligned copy (int32) and its valid mask (bool), and with attention pooling
    each segment's summary (float32 [D] per T tokens)."""
    summary = 0
    if classifier.pooling == SEGMENT_ATTENTION:
        summary = -(-4 * classifier.config.d_model // classifier.segment_len)
    return 4 + 4 + 1 + summary


class ClassifierSignatures(SignatureSet):
    """A `DocumentClassifier`'s signatures (module docstring). labels: the C label names,
    needed with a tokenizer (classify_text answers with names)."""

    serving_default = "classify_document"

    def __init__(self, classifier, tokenizer=None, labels=None):
        if tokenizer is not None and labels is None:
            raise ValueError("a classifier's export with a tokenizer needs the label names "
                             "(classify_text answers with them)")
        if labels is not None:
            labels = [str(label) for label in labels]
            if len(labels) != classifier.num_classes:
                raise ValueError(f"the classifier has {classifier.num_classes} classes, but "
                                 f"{len(labels)} label names were given ({', '.join(labels)})")
        self.labels = labels
        self.max_tokens = most_that_fit(request_token_bytes(classifier))
        super().__init__(classifier, tokenizer, dict(C=classifier.num_classes),
                         most_that_fit(key_value_memory_row_bytes(classifier.config,
                                                                  classifier.mem_len)))

    def export_record(self):
        return {} if self.labels is None else {"labels": self.labels}

    def _size_rules(self, what, token_ids):
        """B in [1, max_batch_size] and B x L (L in whole segments, at least K) <= max_tokens
        (token_ids of any shape)."""
        batch, length = tf.unstack(tf.cast(padded_shape(token_ids, 2), tf.int64))
        segment_len = self.model.segment_len
        segments = tf.maximum((length + segment_len - 1) // segment_len,
                              self.model.grad_segments)
        return [self._batch_rule(f"{what}: B", tf.cast(batch, tf.int32)),
                (batch * segments * segment_len <= self.max_tokens,
                 [f"{what}: B x L, L rounded up to whole segments of T={segment_len} (at least "
                  f"{self.model.grad_segments}), must be at most {self.max_tokens} tokens (a "
                  "request's working tensors of at most 2 GiB), but got B, L =", batch, length])]

    @shared(token_ids=("B L", tf.int32), lengths=("B", tf.int32))
    def _classify(self, token_ids, lengths):
        """The in-graph read of whole documents (classify_document, classify_text)."""
        logits = self.model({TOKEN_IDS: token_ids, LENGTHS: lengths}, training=False,
                            key_value_memory=True)
        probabilities = tf.nn.softmax(tf.cast(logits, tf.float32), axis=-1)
        return {"probabilities": probabilities,
                "label_ids": tf.argmax(probabilities, axis=-1, output_type=tf.int32)}

    @signature(token_ids=("B L", tf.int32), lengths=("B", tf.int32))
    def classify_document(self, token_ids, lengths):
        what = "classify_document"
        batch, length = tf.unstack(padded_shape(token_ids, 2))
        token_ids, lengths = checked(
            [tokens_rule(f"{what}: token_ids", token_ids, "L"),
             shape_rule(f"{what}: lengths", lengths, [batch], "[B] (token_ids: [B, L])"),
             range_rule(f"{what}: lengths", lengths, lambda n: (n >= 1) & (n <= length),
                        "must be in [1, L] (L: the length of token_ids)")]
            + self._size_rules(what, token_ids), token_ids, lengths)
        # Only now are the shapes known to agree: a document's own ids (padding is never read).
        document_ids = tf.boolean_mask(token_ids, tf.sequence_mask(lengths, length))
        token_ids, = checked([ids_rule(f"{what}: token_ids (the first lengths[b] of row b)",
                                       document_ids, self.model.config.vocab_size)], token_ids)
        return self._classify(token_ids, lengths)

    @signature(needs_tokenizer=True, text=("B", tf.string))
    def classify_text(self, text):
        what = "classify_text: text"
        text, = checked(self._text_rules(what, text), text)
        ids, lengths = self._encode(what, text)
        # Framed as tfxl-prepare-classification frames a document: <eod> first.
        token_ids = tf.pad(ids.to_tensor(0), [[0, 0], [1, 0]],
                           constant_values=self.tokenizer.eod_id)
        token_ids, = checked(self._size_rules(what, token_ids), token_ids)
        out = self._classify(token_ids, lengths + 1)
        return {"labels": tf.gather(tf.constant(self.labels), out["label_ids"]), **out}


def export_classifier(classifier, output_dir, version=None, tokenizer=None, labels=None,
                      data_dir=None):
    """Writes `<output_dir>/<version>/saved_model.pb` with the signatures above; returns its path.

    As `tfxl.models.signatures.export_saved_model` writes a language model's (versions, never
    overwritten, published whole). tokenizer, labels: for classify_text; data_dir: where they
    came from (recorded with the vocabulary hash and the label names).
    """
    return publish_version(ClassifierSignatures(classifier, tokenizer, labels), output_dir,
                           version, data_dir)


def export_classifier_at(classifier, filepath, verbose=None, tokenizer=None, labels=None):
    """`DocumentClassifier.export`: the signatures above written at `filepath` itself (no
    version directory; never over an existing file or non-empty directory)."""
    publish_at(ClassifierSignatures(classifier, tokenizer, labels), filepath, verbose)
