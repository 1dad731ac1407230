"""Tokenizers for tfxl: bytes, chars, words, wordpiece, sentencepiece.

Every tokenizer is a `tf.Module` with one interface:

* ``vocab_size`` (int), ``pad_id``, ``eod_id`` and, for line-structured
  tokenizers, ``eos_id``/``unk_id``;
* ``encode(text) -> np.ndarray[int32]`` and ``decode(ids) -> str`` (eager,
  NumPy/Python);
* ``tf_encode(strings[B]) -> tf.RaggedTensor[int32] [B, None]`` and
  ``tf_decode(ids[B, T]) -> tf.Tensor[string] [B]`` (graph ops only, so they
  work inside ``tf.function``, ``tf.data`` and an exported SavedModel; lookup
  tables and tensorflow-text resources are attributes of the module, hence
  tracked when the tokenizer is attached to an exported module);
* ``spec() -> dict`` (JSON-able, stored in the manifest) and
  ``save(data_dir) -> dict`` which writes the vocabulary as plain text next to
  the records and returns the spec; `tokenizer_from_spec(spec, data_dir)`
  reloads it and checks the vocabulary hash;
* ``is_character_level``: True for bytes/chars (report bits per character),
  False for words/wordpiece/sentencepiece (report perplexity);
* ``learn(training_text, options)`` (class method): the tokenizer built from
  the training split, for `tfxl-prepare`.

`TOKENIZERS` is the one registry (kind -> class); `tokenizer_from_spec` and
`load_tokenizer(data_dir)` reload a prepared directory's tokenizer.

Special ids shared by all tokenizers:

* ``<pad>``: fills the unused tail of the last segment of a stream; its target
  is always masked out, so its value never reaches the loss.
* ``<eod>``: "start of document" context token.  It is prepended to every
  document (to the whole split when documents are not kept) so that the very
  first real token is also a target: every token of a split is predicted
  exactly once.  It is never itself a target.

Two independent parts make up the text tokenizers: where the vocabulary
comes from (`_VocabFileTokenizer`: a plain-text vocabulary file, for chars,
words and wordpiece; sentencepiece has its own model file), and the framing of
line-structured tokenizers (`_EosLineFraming`: words, wordpiece and
sentencepiece encode every line on its own and emit ``<eos>`` for every
newline).  Out-of-vocabulary input maps to ``<unk>``.

Id layouts (the saved vocabulary file lists id 0 first):

=============  ==============================================================
bytes          0..255 = the byte value, 256 ``<pad>``, 257 ``<eod>``; no file.
chars          0 ``<pad>``, 1 ``<eod>``, 2 ``<unk>``, then characters by
               descending training-split frequency (ties by code point).
               ``vocab.chars.txt``: one JSON string per line.
words          0 ``<pad>``, 1 ``<eod>``, 2 ``<unk>``, 3 ``<eos>``, then
               whitespace words by descending frequency (ties by word), so
               adaptive-softmax cutoffs split frequent from rare words.
               ``vocab.words.txt``: one word per line.
wordpiece      same four specials, then the learned pieces (``##`` marks a
               word-internal piece).  ``vocab.wordpiece.txt``.
sentencepiece  the model's own ids 0..n-1, then n ``<pad>``, n+1 ``<eod>``,
               n+2 ``<eos>``.  The model (given, or learned from the
               training split with the `sentencepiece` package) is written
               to ``sentencepiece.model``.
=============  ==============================================================

No pickle anywhere: vocabularies are text, the sentencepiece model is its own
protobuf file.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import io
import json
import os
from typing import Callable, Iterable, Iterator, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from tfxl.data.errors import DataError
from tfxl.data.manifest import load_manifest

# tensorflow_text is imported by the tokenizers that use it (and the optional sentencepiece by the
# one function that needs it): loading tensorflow_text loads its op library, which `import tfxl`
# and the other tokenizers do without.

PAD, EOD, UNK, EOS = "<pad>", "<eod>", "<unk>", "<eos>"
# Specials of the vocabulary-file tokenizers, in id order.
TEXT_SPECIALS = (PAD, EOD, UNK)
LINE_SPECIALS = (PAD, EOD, UNK, EOS)



@dataclasses.dataclass(frozen=True)
class VocabularyOptions:
    """How `Tokenizer.learn` builds a vocabulary (tfxl-prepare's flags of the same names)."""

    min_freq: int = 1                   # chars/words: minimum training count
    max_size: int = 0                   # chars/words: whole vocabulary incl. specials; 0 = any
    wordpiece_vocab_size: int = 8000
    sample_bytes: int = 32 << 20        # wordpiece/sentencepiece learn from this many bytes
    sentencepiece_model: Optional[str] = None       # a ready .model file, or
    sentencepiece_vocab_size: Optional[int] = None  # learn one of this size


# The training split as chunks: str for text tokenizers, bytes for `bytes`. Called once per pass.
TrainingText = Callable[[], Iterator]


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _as_id_array(ids, vocab_size: int) -> np.ndarray:
    """Validates ids for `decode`: a token id outside the vocabulary is an error."""
    array = np.asarray(ids, dtype=np.int64).reshape(-1)
    if array.size and (array.min() < 0 or array.max() >= vocab_size):
        bad = int(array[(array < 0) | (array >= vocab_size)][0])
        raise DataError(f"token id {bad} outside the vocabulary [0, {vocab_size})")
    return array


def _tf_drop_ids(ids, drop: Sequence[int]) -> tf.RaggedTensor:
    """ids [B, T] (dense or ragged) -> ragged [B, None] without the `drop` ids."""
    if not isinstance(ids, tf.RaggedTensor):
        ids = tf.RaggedTensor.from_tensor(tf.convert_to_tensor(ids))
    ids = tf.cast(ids, tf.int32)
    keep = tf.ones_like(ids.flat_values, dtype=tf.bool)
    for special in drop:
        keep = tf.logical_and(keep, tf.not_equal(ids.flat_values, special))
    return tf.ragged.boolean_mask(ids, ids.with_flat_values(keep))


def _tf_check_ids(ids: tf.RaggedTensor, vocab_size: int) -> tf.RaggedTensor:
    """In-graph version of `_as_id_array`'s range check."""
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


# ---------------------------------------------------------------------------
# bytes
# ---------------------------------------------------------------------------
class BytesTokenizer(Tokenizer):
    """UTF-8 bytes: id = byte value (0..255), 256 ``<pad>``, 257 ``<eod>``.

    Works on any file, text or binary.  In-graph it uses core TF ops only
    (`tf.strings.bytes_split` + `tf.io.decode_raw`), no tensorflow-text.
    Decoding turns invalid UTF-8 into U+FFFD (errors='replace').
    """

    kind = "bytes"
    is_character_level = True
    reads_text = False
    pad_id = 256
    eod_id = 257
    vocab_size = 258

    def __init__(self, name: str | None = None):
        super().__init__(name=name or "bytes_tokenizer")
        # id -> byte string; specials decode to nothing.
        self._id_to_bytes = tf.constant([bytes([i]) for i in range(256)] + [b"", b""])

    def encode(self, text) -> np.ndarray:
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return np.frombuffer(data, dtype=np.uint8).astype(np.int32)

    def decode(self, ids) -> str:
        array = _as_id_array(ids, self.vocab_size)
        return bytes(array[array < 256].astype(np.uint8)).decode("utf-8", errors="replace")

    def tf_encode(self, strings) -> tf.RaggedTensor:
        pieces = tf.strings.bytes_split(tf.convert_to_tensor(strings, tf.string))
        # Every piece is exactly one byte, so decode_raw gives [n, 1].
        values = tf.reshape(tf.io.decode_raw(pieces.flat_values, tf.uint8), [-1])
        return pieces.with_flat_values(tf.cast(values, tf.int32))

    def tf_decode(self, ids) -> tf.Tensor:
        ids = _tf_check_ids(_tf_drop_ids(ids, ()), self.vocab_size)
        raw = tf.strings.reduce_join(tf.gather(self._id_to_bytes, ids), axis=-1)
        return tf.strings.unicode_transcode(raw, "UTF-8", "UTF-8", errors="replace")

    def spec(self) -> dict:
        # No vocabulary file: hash a canonical description of the id layout.
        return {"type": "bytes", "vocab_size": self.vocab_size,
                "vocab_sha256": sha256_bytes(b"tfxl-bytes-v1:256+<pad>,<eod>")}

    @classmethod
    def load(cls, spec, data_dir):
        return cls()

    @classmethod
    def learn(cls, training_text, options):
        return cls()  # a fixed layout: nothing to learn


# ---------------------------------------------------------------------------
# vocabulary-based tokenizers
# ---------------------------------------------------------------------------
def _frequency_order(counts: collections.Counter, min_freq: int, max_size: int,
                     num_specials: int) -> list:
    """Tokens by descending count (ties by token), trimmed by min_freq/max_size.

    max_size counts the whole vocabulary including specials (0 = unlimited).
    """
    tokens = [t for t, c in counts.items() if c >= max(1, min_freq)]
    tokens.sort(key=lambda t: (-counts[t], t))
    if max_size:
        tokens = tokens[:max(0, max_size - num_specials)]
    return tokens


class _VocabFileTokenizer(Tokenizer):
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
        with open(os.path.join(data_dir, self.vocab_filename), "wb") as f:
            f.write(self._vocab_bytes())
        return self.spec()

    @classmethod
    def load(cls, spec: dict, data_dir: str):
        path = os.path.join(data_dir, spec.get("vocab_file") or cls.vocab_filename)
        data = _read_checked(path, spec.get("vocab_sha256"))
        return cls(cls._vocab_from_text(data.decode("utf-8")))


def _read_checked(path: str, expected_sha256: str | None) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise DataError(f"cannot read vocabulary file {path}: {e.strerror}") from None
    if expected_sha256 and sha256_bytes(data) != expected_sha256:
        raise DataError(f"vocabulary file {path} does not match the manifest "
                        f"(sha256 {sha256_bytes(data)[:12]}..., "
                        f"manifest says {expected_sha256[:12]}...)")
    return data


class CharsTokenizer(_VocabFileTokenizer):
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
        learned = _frequency_order(counts, min_freq, max_size, len(cls.specials))
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
        array = _as_id_array(ids, self.vocab_size)
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
        ids = _tf_check_ids(_tf_drop_ids(ids, ()), self.vocab_size)
        return tf.strings.reduce_join(tf.gather(self._id_to_text, ids), axis=-1)


class _EosLineFraming:
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
        ids = _tf_check_ids(_tf_drop_ids(ids, (self.pad_id, self.eod_id)), self.vocab_size)
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
        array = _as_id_array(ids, self.vocab_size)
        return self.tf_decode(tf.constant(array[None], tf.int32))[0].numpy().decode("utf-8")

    def encode(self, text: str) -> np.ndarray:
        return self.tf_encode(tf.constant([text]))[0].numpy().astype(np.int32)


class _LineVocabFileTokenizer(_EosLineFraming, _VocabFileTokenizer):
    """A vocabulary file whose specials include ``<eos>``, with line framing."""

    specials = LINE_SPECIALS

    def __init__(self, vocab, name):
        super().__init__(vocab, name)
        self.eos_id = self.vocab.index(EOS)


class WordsTokenizer(_LineVocabFileTokenizer):
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
        return cls(list(cls.specials) + _frequency_order(
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
        array = _as_id_array(ids, self.vocab_size)
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


class WordPieceTokenizer(_LineVocabFileTokenizer):
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
        from tensorflow_text.tools.wordpiece_vocab import \
            bert_vocab_from_dataset as bert_vocab
        lines = [line for line in lines if line.strip()]
        dataset = tf.data.Dataset.from_tensor_slices(tf.constant(lines or [""], tf.string))
        dataset = dataset.batch(1024)
        learned = bert_vocab.bert_vocab_from_dataset(
            dataset, vocab_size=vocab_size, reserved_tokens=list(cls.specials),
            bert_tokenizer_params={"lower_case": lower_case}, learn_params={})
        vocab = list(cls.specials) + [t for t in learned if t not in cls.specials]
        return cls(vocab)

    @classmethod
    def learn(cls, training_text, options):
        return cls.learn_from_lines(_sample_lines(training_text, options.sample_bytes),
                                    options.wordpiece_vocab_size)

    def _tf_encode_lines(self, lines):
        return self._wordpiece.tokenize(lines)

    def _tf_decode_lines(self, ids):
        return self._wordpiece.detokenize(ids)


class SentencePieceTokenizer(_EosLineFraming, Tokenizer):
    """A SentencePiece model through tensorflow-text: a given ``.model`` file, or one learned from
    the training split with the `sentencepiece` package (`learn`, the ``sentencepiece`` extra).

    Ids 0..n-1 are the model's; n ``<pad>``, n+1 ``<eod>``, n+2 ``<eos>``
    (``<eos>`` per newline: each line is encoded separately, as
    sentencepiece treats a newline as ordinary whitespace).
    """

    kind = "sentencepiece"
    model_filename = "sentencepiece.model"

    def __init__(self, model: bytes, name: str | None = None):
        super().__init__(name=name or "sentencepiece_tokenizer")
        import tensorflow_text as tf_text
        self.model = bytes(model)
        try:
            self._sp = tf_text.SentencepieceTokenizer(model=self.model, out_type=tf.int32)
            pieces = int(self._sp.vocab_size().numpy())
        except (tf.errors.InvalidArgumentError, tf.errors.InternalError) as e:
            first_line = e.message.splitlines()[0]
            raise DataError(f"not a valid sentencepiece model: {first_line}") from None
        self.pad_id, self.eod_id, self.eos_id = pieces, pieces + 1, pieces + 2
        self.vocab_size = pieces + 3

    def _sentencepiece_call(self, method: str, value):
        try:
            return getattr(self._sp, method)(value)
        except tf.errors.NotFoundError:
            # tensorflow-text's sentencepiece resource is owned by an eager
            # kernel, and tf.random.set_seed() (keras.utils.set_random_seed)
            # clears the eager kernel cache, deleting it.  Rebuild it eagerly.
            if not tf.executing_eagerly():
                raise
            import tensorflow_text as tf_text
            self._sp = tf_text.SentencepieceTokenizer(model=self.model, out_type=tf.int32)
            return getattr(self._sp, method)(value)

    def _tf_encode_lines(self, lines):
        return self._sentencepiece_call("tokenize", lines)

    def _tf_decode_lines(self, ids):
        return self._sentencepiece_call("detokenize", ids)

    def spec(self) -> dict:
        return {"type": "sentencepiece", "vocab_size": self.vocab_size,
                "model_file": self.model_filename, "vocab_sha256": sha256_bytes(self.model)}

    def save(self, data_dir: str) -> dict:
        with open(os.path.join(data_dir, self.model_filename), "wb") as f:
            f.write(self.model)
        return self.spec()

    @classmethod
    def from_file(cls, path: str):
        if not os.path.isfile(path):
            raise DataError(f"--sentencepiece_model: file not found: {path}")
        try:
            with open(path, "rb") as f:
                return cls(f.read())
        except OSError as e:
            raise DataError(f"--sentencepiece_model: cannot read {path}: {e.strerror}") from None

    @classmethod
    def load(cls, spec: dict, data_dir: str):
        path = os.path.join(data_dir, spec.get("model_file") or cls.model_filename)
        return cls(_read_checked(path, spec.get("vocab_sha256")))

    @classmethod
    def learn(cls, training_text, options):
        if options.sentencepiece_model:
            return cls.from_file(options.sentencepiece_model)
        return cls(learn_sentencepiece_model(
            _sample_lines(training_text, options.sample_bytes), options.sentencepiece_vocab_size))


def learn_sentencepiece_model(lines: Iterable[str], vocab_size: int) -> bytes:
    """A unigram SentencePiece model (its serialized protobuf) learned from `lines`.

    The ``sentencepiece`` package is needed only here (``pip install 'tfxl[sentencepiece]'``).
    Its own ``<s>``/``</s>`` are left out: tfxl frames lines itself (``<eod>``, ``<eos>``).
    """
    try:
        import sentencepiece
    except ImportError:
        raise DataError("--sentencepiece_vocab_size needs the sentencepiece package: "
                        "pip install 'tfxl[sentencepiece]'") from None
    model = io.BytesIO()
    try:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=(line for line in lines if line.strip()), model_writer=model,
            vocab_size=vocab_size, bos_id=-1, eos_id=-1, minloglevel=2)
    except RuntimeError as e:
        # "INTERNAL: src/trainer_interface.cc(744) [check] Vocabulary size too high (40). ..."
        reason = str(e).partition("] ")[2].strip() or "the training split has no text"
        raise DataError(f"--sentencepiece_vocab_size={vocab_size}: cannot learn a "
                        f"sentencepiece model: {reason}") from None
    return model.getvalue()


def _sample_lines(training_text: TrainingText, sample_bytes: int) -> list:
    """The lines of the training split's first chunks, up to about `sample_bytes`."""
    lines, size = [], 0
    for chunk in training_text():
        lines.extend(chunk.splitlines())
        size += len(chunk)
        if size >= sample_bytes:
            break
    return lines


# The one registry of tokenizers: kind (``--tokenizer``, the manifest's ``type``) -> class.
TOKENIZERS = {cls.kind: cls for cls in (BytesTokenizer, CharsTokenizer, WordsTokenizer,
                                        WordPieceTokenizer, SentencePieceTokenizer)}


def spec_files(spec: dict) -> List[str]:
    """The files a tokenizer spec names (words/chars/wordpiece vocabulary, SentencePiece model),
    relative to its data directory."""
    return [spec[key] for key in ("vocab_file", "model_file") if spec.get(key)]


def tokenizer_from_spec(spec: dict, data_dir: str) -> Tokenizer:
    """Rebuilds the tokenizer described by a manifest's ``tokenizer`` entry.

    Vocabulary files are read from `data_dir` and their sha256 must match the
    spec (a `DataError` names the file otherwise).
    """
    kind = spec.get("type")
    if kind not in TOKENIZERS:
        raise DataError(f"unknown tokenizer type {kind!r} "
                        f"(expected one of {', '.join(TOKENIZERS)})")
    return TOKENIZERS[kind].load(spec, data_dir)


def load_tokenizer(data_dir: str, manifest: Optional[dict] = None) -> Tokenizer:
    """The tokenizer a data directory was prepared with."""
    manifest = manifest or load_manifest(data_dir)
    return tokenizer_from_spec(manifest["tokenizer"], data_dir)
