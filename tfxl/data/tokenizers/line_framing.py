"""Newline <-> ``<eos>`` framing (`EosLineFraming`), mixed into the tokenizers that encode line by
line (words, wordpiece, sentencepiece), and `LineVocabFileTokenizer`: a vocabulary file with
that framing."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfxl.data.tokenizers.base import EOS, LINE_SPECIALS, as_id_array, tf_check_ids, tf_drop_ids
from tfxl.data.tokenizers.vocab_file import VocabFileTokenizer


class EosLineFraming:
    """Newline <-> ``<eos>`` framing, mixed into tokenizers that encode line by line.

    ``"a b\\nc"`` encodes as ``[a, b, <eos>, c]``: a newline becomes ``<eos>``;
    text after the last newline gets none (files normally end with one).
    Decoding turns ``<eos>`` back into a newline.  The tokenizer supplies
    ``eos_id`` and how one batch of lines is encoded and decoded.
    """

    eos_id: int

    def _tf_encode_lines(self, lines: tf.Tensor) -> tf.RaggedTensor:
        """lines [L] -> ragged ids [L, None], without <eos>."""
        raise NotImplementedError

    def _tf_decode_lines(self, ids: tf.RaggedTensor) -> tf.Tensor:
        """ragged ids [L, None] without specials -> strings [L]."""
        raise NotImplementedError

    def tf_encode(self, strings) -> tf.RaggedTensor:
        lines = tf.strings.split(tf.convert_to_tensor(strings, tf.string), "\n")  # [B, L]
        ids = lines.with_flat_values(self._tf_encode_lines(lines.flat_values))  # [B, L, W]
        # Every line but the last one of each string ended with a newline.
        line_in_row = tf.ragged.range(lines.row_lengths()).flat_values
        rows_of_lines = tf.gather(lines.row_lengths(), lines.value_rowids())
        ends_with_newline = line_in_row < rows_of_lines - 1
        eos = tf.RaggedTensor.from_row_lengths(
            tf.fill([tf.reduce_sum(tf.cast(ends_with_newline, tf.int32))], self.eos_id),
            tf.cast(ends_with_newline, tf.int64))
        ids = tf.concat([ids, lines.with_flat_values(eos)], axis=2)
        return ids.merge_dims(1, 2)

    def tf_decode(self, ids) -> tf.Tensor:
        ids = tf_check_ids(tf_drop_ids(ids, (self.pad_id, self.eod_id)), self.vocab_size)
        values = ids.flat_values
        is_eos = tf.cast(tf.equal(values, self.eos_id), tf.int64)
        row_ids = ids.value_rowids()
        # Line number of each token inside its row: count of earlier <eos>.
        eos_before = tf.cumsum(is_eos, exclusive=True)
        row_starts = ids.row_splits[:-1]
        eos_before_row = tf.gather(tf.concat([eos_before, [0]], 0), row_starts)
        eos_before_row = tf.where(ids.row_lengths() > 0, eos_before_row,
                                  tf.zeros_like(eos_before_row))
        line_in_row = eos_before - tf.gather(eos_before_row, row_ids)
        lines_per_row = tf.math.unsorted_segment_sum(is_eos, row_ids, ids.nrows()) + 1
        first_line = tf.cumsum(lines_per_row, exclusive=True)
        line_ids = tf.gather(first_line, row_ids) + line_in_row
        total_lines = tf.reduce_sum(lines_per_row)
        keep = tf.equal(is_eos, 0)
        line_tokens = tf.RaggedTensor.from_value_rowids(
            tf.boolean_mask(values, keep), tf.boolean_mask(line_ids, keep), nrows=total_lines)
        text = self._tf_decode_lines(line_tokens)
        # Every line except the last of its row was closed by an <eos>.
        line_index = tf.ragged.range(lines_per_row).flat_values
        closes = line_index < tf.repeat(lines_per_row, lines_per_row) - 1
        text = text + tf.where(closes, "\n", "")
        return tf.strings.reduce_join(
            tf.RaggedTensor.from_row_lengths(text, lines_per_row), axis=1)

    def decode(self, ids) -> str:
        array = as_id_array(ids, self.vocab_size)
        return self.tf_decode(tf.constant(array[None], tf.int32))[0].numpy().decode("utf-8")

    def encode(self, text: str) -> np.ndarray:
        return self.tf_encode(tf.constant([text]))[0].numpy().astype(np.int32)


class LineVocabFileTokenizer(EosLineFraming, VocabFileTokenizer):
    """A vocabulary file whose specials include ``<eos>``, with line framing."""

    specials = LINE_SPECIALS

    def __init__(self, vocab, name):
        super().__init__(vocab, name)
        self.eos_id = self.vocab.index(EOS)
