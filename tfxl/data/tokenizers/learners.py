"""How tokenizers learn their vocabulary from the training split (`Tokenizer.learn`): the
options (`VocabularyOptions`, derived from tfxl-prepare's `PrepareConfig` in `tfxl.data.options`),
frequency-ordered vocabularies, the training sample, and the SentencePiece and WordPiece
learners."""

from __future__ import annotations

import collections
import io
from typing import Callable, Iterable, Iterator, Sequence

import tensorflow as tf

from tfxl.data.errors import DataError
from tfxl.data.options import VocabularyOptions  # noqa: F401 (declared with PrepareConfig)


# The training split as chunks: str for text tokenizers, bytes for `bytes`. Called once per pass.
TrainingText = Callable[[], Iterator]


def frequency_order(counts: collections.Counter, min_freq: int, max_size: int,
                    num_specials: int) -> list:
    """Tokens by descending count (ties by token), trimmed by min_freq/max_size.

    max_size counts the whole vocabulary including specials (0 = unlimited).
    """
    tokens = [t for t, c in counts.items() if c >= max(1, min_freq)]
    tokens.sort(key=lambda t: (-counts[t], t))
    if max_size:
        tokens = tokens[:max(0, max_size - num_specials)]
    return tokens


def sample_lines(training_text: TrainingText, sample_bytes: int) -> list:
    """The lines of the training split's first chunks, up to about `sample_bytes`."""
    lines, size = [], 0
    for chunk in training_text():
        lines.extend(chunk.splitlines())
        size += len(chunk)
        if size >= sample_bytes:
            break
    return lines


def learn_sentencepiece_model(lines: Iterable[str], vocab_size: int) -> bytes:
    """A unigram SentencePiece model (its serialized protobuf) learned from `lines`.

    The ``sentencepiece`` package is needed only here (``pip install '.[sentencepiece]'`` in a
    clone of tfxl).
    Its own ``<s>``/``</s>`` are left out: tfxl frames lines itself (``<eod>``, ``<eos>``).
    """
    try:
        import sentencepiece
    except ImportError:
        raise DataError("--sentencepiece_vocab_size needs the sentencepiece package: "
                        "pip install '.[sentencepiece]' in a clone of tfxl") from None
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


def learn_wordpiece_vocab(lines: Iterable[str], vocab_size: int, reserved: Sequence[str],
                          lower_case: bool = False) -> list:
    """WordPiece pieces learned from `lines` by tensorflow-text's `bert_vocab_from_dataset`
    (`reserved` tokens first, as it lists them)."""
    from tensorflow_text.tools.wordpiece_vocab import \
        bert_vocab_from_dataset as bert_vocab
    lines = [line for line in lines if line.strip()]
    dataset = tf.data.Dataset.from_tensor_slices(tf.constant(lines or [""], tf.string))
    dataset = dataset.batch(1024)
    return bert_vocab.bert_vocab_from_dataset(
        dataset, vocab_size=vocab_size, reserved_tokens=list(reserved),
        bert_tokenizer_params={"lower_case": lower_case}, learn_params={})
