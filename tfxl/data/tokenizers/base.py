"""The tokenizer interface (`Tokenizer`), the special tokens, and the id checks every tokenizer
shares; see the package docstring for the interface and the id layouts."""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np
import tensorflow as tf

from tfxl.data.errors import DataError
from tfxl.data.tokenizers.learners import TrainingText, VocabularyOptions
from tfxl.files import read_bytes, reason

# tensorflow_text is imported by the tokenizers that use it (and the optional sentencepiece by the
# one function that needs it): loading tensorflow_text loads its op library, which `import tfxl`
# and the other tokenizers do without.

PAD, EOD, UNK, EOS = "<pad>", "<eod>", "<unk>", "<eos>"
# Specials of the vocabulary-file tokenizers, in id order.
TEXT_SPECIALS = (PAD, EOD, UNK)
LINE_SPECIALS = (PAD, EOD, UNK, EOS)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def as_id_array(ids, vocab_size: int) -> np.ndarray:
    """Validates ids for `decode`: a token id outside the vocabulary is an error."""
    array = np.asarray(ids, dtype=np.int64).reshape(-1)
    if array.size and (array.min() < 0 or array.max() >= vocab_size):
        bad = int(array[(array < 0) | (array >= vocab_size)][0])
        raise DataError(f"token id {bad} outside the vocabulary [0, {vocab_size})")
    return array


def tf_drop_ids(ids, drop: Sequence[int]) -> tf.RaggedTensor:
    """ids [B, T] (dense or ragged) -> ragged [B, None] without the `drop` ids."""
    if not isinstance(ids, tf.RaggedTensor):
        ids = tf.RaggedTensor.from_tensor(tf.convert_to_tensor(ids))
    ids = tf.cast(ids, tf.int32)
    keep = tf.ones_like(ids.flat_values, dtype=tf.bool)
    for special in drop:
        keep = tf.logical_and(keep, tf.not_equal(ids.flat_values, special))
    return tf.ragged.boolean_mask(ids, ids.with_flat_values(keep))


def tf_check_ids(ids: tf.RaggedTensor, vocab_size: int) -> tf.RaggedTensor:
    """In-graph version of `as_id_array`'s range check."""
    values = ids.flat_values
    ok = tf.reduce_all(tf.logical_and(values >= 0, values < vocab_size))
    check = tf.debugging.Assert(
        ok, [f"token id outside the vocabulary [0, {vocab_size}); ids:", values], summarize=8)
    with tf.control_dependencies([check]):
        return ids.with_flat_values(tf.identity(values))


class Tokenizer(tf.Module):
    """Common interface; see the module docstring."""

    kind: str = ""
    is_character_level: bool = False
    reads_text: bool = True          # False: reads raw bytes (any file), no UTF-8 decoding
    frequency_ordered: bool = False  # ids by descending training frequency (cutoffs make sense)
    pad_id: int
    eod_id: int
    vocab_size: int

    # --- eager -----------------------------------------------------------
    def encode(self, text: str) -> np.ndarray:
        raise NotImplementedError

    def decode(self, ids) -> str:
        raise NotImplementedError

    # --- graph -----------------------------------------------------------
    def tf_encode(self, strings) -> tf.RaggedTensor:
        raise NotImplementedError

    def tf_decode(self, ids) -> tf.Tensor:
        raise NotImplementedError

    # --- persistence -----------------------------------------------------
    def spec(self) -> dict:
        raise NotImplementedError

    def save(self, data_dir: str) -> dict:
        """Writes the vocabulary file(s) into `data_dir`; returns `spec()`."""
        return self.spec()

    @classmethod
    def load(cls, spec: dict, data_dir: str) -> "Tokenizer":
        """The tokenizer `save` wrote into `data_dir` (`spec` is what it returned)."""
        raise NotImplementedError

    # --- construction ----------------------------------------------------
    @classmethod
    def learn(cls, training_text: TrainingText, options: VocabularyOptions) -> "Tokenizer":
        """The tokenizer for a corpus, built from its training split."""
        raise NotImplementedError

    @property
    def vocab_sha256(self) -> str:
        return self.spec()["vocab_sha256"]


def read_checked(path: str, expected_sha256: str | None) -> bytes:
    """A vocabulary file's bytes (any TensorFlow file system), checked against its sha256."""
    try:
        data = read_bytes(path)
    except (OSError, tf.errors.OpError) as e:
        raise DataError(f"cannot read vocabulary file {path}: {reason(e, path)}"
                        ) from None
    if expected_sha256 and sha256_bytes(data) != expected_sha256:
        raise DataError(f"vocabulary file {path} does not match the manifest "
                        f"(sha256 {sha256_bytes(data)[:12]}..., "
                        f"manifest says {expected_sha256[:12]}...)")
    return data
