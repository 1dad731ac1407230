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
comes from (`VocabFileTokenizer`: a plain-text vocabulary file, for chars,
words and wordpiece; sentencepiece has its own model file), and the framing of
line-structured tokenizers (`EosLineFraming`: words, wordpiece and
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
Layout (one tokenizer per module, as keras-hub does): `base` (the `Tokenizer` interface, the
specials, id checks), `learners` (`VocabularyOptions` and how vocabularies are learned),
`vocab_file` and `line_framing` (the two mixins above), `bytes_tokenizer`, `chars_tokenizer`,
`words_tokenizer`, `wordpiece_tokenizer`, `sentencepiece_tokenizer`, and `registry`
(`TOKENIZERS`, `tokenizer_from_spec`, `load_tokenizer`). The names below are re-exported here, so
``from tfxl.data.tokenizers import ...`` names them all.
"""

from tfxl.data.tokenizers.base import (EOD, EOS, LINE_SPECIALS, PAD, TEXT_SPECIALS, UNK,
                                       Tokenizer, sha256_bytes)
from tfxl.data.tokenizers.bytes_tokenizer import BytesTokenizer
from tfxl.data.tokenizers.chars_tokenizer import CharsTokenizer
from tfxl.data.tokenizers.learners import (TrainingText, VocabularyOptions,
                                           learn_sentencepiece_model)
from tfxl.data.tokenizers.line_framing import EosLineFraming, LineVocabFileTokenizer
from tfxl.data.tokenizers.registry import (TOKENIZERS, load_tokenizer, spec_files,
                                           tokenizer_from_spec, with_spec_files)
from tfxl.data.tokenizers.sentencepiece_tokenizer import SentencePieceTokenizer
from tfxl.data.tokenizers.vocab_file import VocabFileTokenizer
from tfxl.data.tokenizers.wordpiece_tokenizer import WordPieceTokenizer
from tfxl.data.tokenizers.words_tokenizer import WordsTokenizer

__all__ = [
    "EOD", "EOS", "LINE_SPECIALS", "PAD", "TEXT_SPECIALS", "UNK", "Tokenizer", "sha256_bytes",
    "BytesTokenizer", "CharsTokenizer", "WordsTokenizer", "WordPieceTokenizer",
    "SentencePieceTokenizer", "VocabFileTokenizer", "EosLineFraming", "LineVocabFileTokenizer",
    "TrainingText", "VocabularyOptions", "learn_sentencepiece_model",
    "TOKENIZERS", "load_tokenizer", "spec_files", "tokenizer_from_spec", "with_spec_files",
]
