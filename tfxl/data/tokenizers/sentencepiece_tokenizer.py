"""The `sentencepiece` tokenizer: a given or learned SentencePiece model through tensorflow-text."""

from __future__ import annotations

import os

import tensorflow as tf

from tfxl.data.errors import DataError
from tfxl.data.tokenizers.base import Tokenizer, read_checked, sha256_bytes
from tfxl.data.tokenizers.learners import learn_sentencepiece_model, sample_lines
from tfxl.data.tokenizers.line_framing import EosLineFraming
from tfxl.files import read_bytes, reason, write_bytes


class SentencePieceTokenizer(EosLineFraming, Tokenizer):
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
        write_bytes(os.path.join(data_dir, self.model_filename), self.model)
        return self.spec()

    @classmethod
    def from_file(cls, path: str):
        """A ready model file, on any TensorFlow file system."""
        try:
            if not tf.io.gfile.exists(path) or tf.io.gfile.isdir(path):
                raise DataError(f"--sentencepiece_model: file not found: {path}")
            model = read_bytes(path)
        except (OSError, tf.errors.OpError) as e:
            raise DataError(f"--sentencepiece_model: cannot read {path}: "
                            f"{reason(e, path)}") from None
        return cls(model)

    @classmethod
    def load(cls, spec: dict, data_dir: str):
        path = os.path.join(data_dir, spec.get("model_file") or cls.model_filename)
        return cls(read_checked(path, spec.get("vocab_sha256")))

    @classmethod
    def learn(cls, training_text, options):
        if options.sentencepiece_model:
            return cls.from_file(options.sentencepiece_model)
        return cls(learn_sentencepiece_model(
            sample_lines(training_text, options.wordpiece_sample_bytes),
            options.sentencepiece_vocab_size))
