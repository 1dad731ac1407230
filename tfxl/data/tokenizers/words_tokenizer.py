"""The `words` tokenizer: whitespace words by training frequency, ``<eos>`` per line."""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf

from tfxl.data.tokenizers.base import EOD, PAD, as_id_array
from tfxl.data.tokenizers.learners import frequency_order
from tfxl.data.tokenizers.line_framing import LineVocabFileTokenizer


class WordsTokenizer(LineVocabFileTokenizer):
    """Whitespace words with ``<eos>`` per line (WikiText/PTB style).

    The vocabulary comes from the training split (`build`) with `min_freq` and
    `max_size` (whole vocabulary, specials included; 0 = unlimited), ordered
    by frequency.  Words are split on ASCII whitespace (Python's
    `bytes.split()` = `tf.strings.split(sep=None)`); decoding joins words of a
    line with single spaces.
    """

    kind = "words"
    frequency_ordered = True
    vocab_filename = "vocab.words.txt"

    def __init__(self, vocab, name: str | None = None):
        super().__init__(vocab, name or "words_tokenizer")
        self._bytes_index = {t.encode("utf-8"): i for i, t in enumerate(self.vocab)}
        self._id_to_text = tf.constant(
            ["" if t in (PAD, EOD) else t for t in self.vocab])

    @classmethod
    def build(cls, counts: collections.Counter, min_freq: int = 1, max_size: int = 0):
        """counts: word (bytes or str) -> count, from the training split."""
        text_counts = collections.Counter()
        for word, count in counts.items():
            text_counts[word.decode("utf-8") if isinstance(word, bytes) else word] += count
        for special in cls.specials:
            text_counts.pop(special, None)
        return cls(list(cls.specials) + frequency_order(
            text_counts, min_freq, max_size, len(cls.specials)))

    @classmethod
    def learn(cls, training_text, options):
        counts = collections.Counter()
        for chunk in training_text():
            counts.update(chunk.encode("utf-8").split())
        return cls.build(counts, options.min_freq, options.max_size)

    def encode(self, text: str) -> np.ndarray:
        """Same ids as the graph path, without a TensorFlow call (fast for `tfxl-prepare`)."""
        data = text.encode("utf-8")
        get, unk, eos = self._bytes_index.get, self.unk_id, self.eos_id
        out = []
        lines = data.split(b"\n")
        for line in lines[:-1]:
            out.extend([get(w, unk) for w in line.split()])
            out.append(eos)
        out.extend([get(w, unk) for w in lines[-1].split()])
        return np.asarray(out, dtype=np.int32)

    def decode(self, ids) -> str:
        array = as_id_array(ids, self.vocab_size)
        lines, words = [], []
        for i in array.tolist():
            if i == self.eos_id:
                lines.append(" ".join(words))
                words = []
            elif i not in (self.pad_id, self.eod_id):
                words.append(self.vocab[i])
        lines.append(" ".join(words))
        return "\n".join(lines)

    def _tf_encode_lines(self, lines):
        words = tf.strings.split(lines)
        return words.with_flat_values(self._table.lookup(words.flat_values))

    def _tf_decode_lines(self, ids):
        return tf.strings.reduce_join(tf.gather(self._id_to_text, ids), axis=-1, separator=" ")
