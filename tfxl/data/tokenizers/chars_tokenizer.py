"""The `chars` tokenizer: Unicode characters by training frequency (the text8 setting)."""

from __future__ import annotations

import collections
import json
from typing import Sequence

import numpy as np
import tensorflow as tf

from tfxl.data.tokenizers.base import (EOD, PAD, TEXT_SPECIALS, UNK, as_id_array, tf_check_ids,
                                       tf_drop_ids)
from tfxl.data.tokenizers.learners import frequency_order
from tfxl.data.tokenizers.vocab_file import VocabFileTokenizer


class CharsTokenizer(VocabFileTokenizer):
    """Unicode characters; the vocabulary is built from the training split.

    This is the text8 setting of the paper.  Characters unseen in training map
    to ``<unk>``, which decodes to U+FFFD.
    """

    kind = "chars"
    is_character_level = True
    vocab_filename = "vocab.chars.txt"
    specials = TEXT_SPECIALS

    def __init__(self, vocab: Sequence[str], name: str | None = None):
        super().__init__(vocab, name or "chars_tokenizer")
        # Sorted code points -> ids, for a vectorised NumPy encode.
        chars = [(ord(t), i) for i, t in enumerate(self.vocab) if i >= len(self.specials)]
        chars.sort()
        self._code_points = np.array([c for c, _ in chars], dtype=np.uint32)
        self._code_ids = np.array([i for _, i in chars], dtype=np.int32)
        self._id_to_text = tf.constant(
            ["" if t in (PAD, EOD) else ("\ufffd" if t == UNK else t) for t in self.vocab])

    @classmethod
    def build(cls, counts: collections.Counter, min_freq: int = 1, max_size: int = 0):
        learned = frequency_order(counts, min_freq, max_size, len(cls.specials))
        return cls(list(cls.specials) + learned)

    @classmethod
    def learn(cls, training_text, options):
        counts = collections.Counter()
        for chunk in training_text():
            counts.update(chunk)
        return cls.build(counts, options.min_freq, options.max_size)

    @classmethod
    def _vocab_to_text(cls, vocab):
        # One JSON string per line: newline, tab and space are characters too.
        return "".join(json.dumps(t, ensure_ascii=False) + "\n" for t in vocab)

    @classmethod
    def _vocab_from_text(cls, text):
        return [json.loads(line) for line in text.split("\n")[:-1]]

    def encode(self, text: str) -> np.ndarray:
        points = np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), dtype="<u4")
        if not self._code_points.size:
            return np.full(points.shape, self.unk_id, np.int32)
        where = np.searchsorted(self._code_points, points)
        where = np.minimum(where, self._code_points.size - 1)
        found = self._code_points[where] == points
        return np.where(found, self._code_ids[where], self.unk_id).astype(np.int32)

    def decode(self, ids) -> str:
        array = as_id_array(ids, self.vocab_size)
        out = []
        for i in array.tolist():
            token = self.vocab[i]
            if token == UNK:
                out.append("\ufffd")
            elif token not in (PAD, EOD):
                out.append(token)
        return "".join(out)

    def tf_encode(self, strings) -> tf.RaggedTensor:
        chars = tf.strings.unicode_split(tf.convert_to_tensor(strings, tf.string), "UTF-8",
                                         errors="replace")
        return chars.with_flat_values(self._table.lookup(chars.flat_values))

    def tf_decode(self, ids) -> tf.Tensor:
        ids = tf_check_ids(tf_drop_ids(ids, ()), self.vocab_size)
        return tf.strings.reduce_join(tf.gather(self._id_to_text, ids), axis=-1)
