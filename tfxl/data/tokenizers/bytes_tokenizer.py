"""The `bytes` tokenizer: UTF-8 bytes, a fixed layout with nothing to learn."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfxl.data.tokenizers.base import (Tokenizer, as_id_array, sha256_bytes, tf_check_ids,
                                       tf_drop_ids)


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
        array = as_id_array(ids, self.vocab_size)
        return bytes(array[array < 256].astype(np.uint8)).decode("utf-8", errors="replace")

    def tf_encode(self, strings) -> tf.RaggedTensor:
        pieces = tf.strings.bytes_split(tf.convert_to_tensor(strings, tf.string))
        # Every piece is exactly one byte, so decode_raw gives [n, 1].
        values = tf.reshape(tf.io.decode_raw(pieces.flat_values, tf.uint8), [-1])
        return pieces.with_flat_values(tf.cast(values, tf.int32))

    def tf_decode(self, ids) -> tf.Tensor:
        ids = tf_check_ids(tf_drop_ids(ids, ()), self.vocab_size)
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
