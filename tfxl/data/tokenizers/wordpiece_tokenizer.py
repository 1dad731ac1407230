"""The `wordpiece` tokenizer: learned subword pieces through tensorflow-text."""

from __future__ import annotations

from typing import Iterable

import tensorflow as tf

from tfxl.data.tokenizers.base import UNK
from tfxl.data.tokenizers.learners import learn_wordpiece_vocab, sample_lines
from tfxl.data.tokenizers.line_framing import LineVocabFileTokenizer


class WordPieceTokenizer(LineVocabFileTokenizer):
    """Subword pieces, tokenised with tensorflow-text's FastWordpieceTokenizer.

    The vocabulary is learned from (a sample of) the training split with
    `tensorflow_text.tools.wordpiece_vocab.bert_vocab_from_dataset` (see
    `learn`).  The tokenizer does its own BERT-style pre-tokenisation
    (whitespace and punctuation split), so decoding gives the words of each
    line separated by single spaces (``"a, b"`` comes back as ``"a , b"``).
    """

    kind = "wordpiece"
    vocab_filename = "vocab.wordpiece.txt"

    def __init__(self, vocab, name: str | None = None):
        super().__init__(vocab, name or "wordpiece_tokenizer")
        import tensorflow_text as tf_text
        self._wordpiece = tf_text.FastWordpieceTokenizer(
            vocab=self.vocab, suffix_indicator="##", unknown_token=UNK,
            no_pretokenization=False, support_detokenization=True,
            token_out_type=tf.int32)

    @classmethod
    def learn_from_lines(cls, lines: Iterable[str], vocab_size: int, lower_case: bool = False):
        learned = learn_wordpiece_vocab(lines, vocab_size, cls.specials, lower_case)
        vocab = list(cls.specials) + [t for t in learned if t not in cls.specials]
        return cls(vocab)

    @classmethod
    def learn(cls, training_text, options):
        return cls.learn_from_lines(sample_lines(training_text, options.wordpiece_sample_bytes),
                                    options.wordpiece_vocab_size)

    def _tf_encode_lines(self, lines):
        return self._wordpiece.tokenize(lines)

    def _tf_decode_lines(self, ids):
        return self._wordpiece.detokenize(ids)
