"""`VocabFileTokenizer`: the part of the chars, words and wordpiece tokenizers whose vocabulary
is a list of tokens saved as a plain-text file next to the records."""

from __future__ import annotations

import os
from typing import Sequence

import tensorflow as tf

from tfxl.data.errors import DataError
from tfxl.data.tokenizers.base import (EOD, PAD, TEXT_SPECIALS, UNK, Tokenizer, read_checked,
                                       sha256_bytes)
from tfxl.files import write_bytes


class VocabFileTokenizer(Tokenizer):
    """A tokenizer whose vocabulary is a list of tokens saved as a plain-text file."""

    vocab_filename = ""
    specials: Sequence[str] = TEXT_SPECIALS

    def __init__(self, vocab: Sequence[str], name: str):
        super().__init__(name=name)
        self.vocab = list(vocab)
        if tuple(self.vocab[:len(self.specials)]) != tuple(self.specials):
            raise DataError(f"{self.kind} vocabulary must start with {list(self.specials)}")
        self.vocab_size = len(self.vocab)
        self.pad_id = self.vocab.index(PAD)
        self.eod_id = self.vocab.index(EOD)
        self.unk_id = self.vocab.index(UNK)
        self._table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(self.vocab), tf.range(self.vocab_size, dtype=tf.int32)),
            default_value=self.unk_id)

    # Vocabulary file <-> list of tokens.
    @classmethod
    def _vocab_to_text(cls, vocab: Sequence[str]) -> str:
        return "".join(t + "\n" for t in vocab)

    @classmethod
    def _vocab_from_text(cls, text: str) -> list:
        return text.split("\n")[:-1]

    def _vocab_bytes(self) -> bytes:
        return self._vocab_to_text(self.vocab).encode("utf-8")

    def spec(self) -> dict:
        return {"type": self.kind, "vocab_size": self.vocab_size,
                "vocab_file": self.vocab_filename,
                "vocab_sha256": sha256_bytes(self._vocab_bytes())}

    def save(self, data_dir: str) -> dict:
        write_bytes(os.path.join(data_dir, self.vocab_filename), self._vocab_bytes())
        return self.spec()

    @classmethod
    def load(cls, spec: dict, data_dir: str):
        path = os.path.join(data_dir, spec.get("vocab_file") or cls.vocab_filename)
        data = read_checked(path, spec.get("vocab_sha256"))
        return cls(cls._vocab_from_text(data.decode("utf-8")))
