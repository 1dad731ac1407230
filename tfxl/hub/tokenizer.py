"""`TransfoXLTokenizer`: a tfxl tokenizer (`tfxl.data.tokenizers`) as a keras-hub Tokenizer.

A thin wrapper: ids, vocabulary files and their checks are the tfxl tokenizer's. The keras-hub
side adds what its preprocessors read: the special ids (start and end of a document are both
tfxl's `<eod>`, padding is `<pad>`) and the preset assets (the vocabulary file in
assets/tokenizer/, reloaded and hash-checked through the spec kept in tokenizer.json).
"""

import keras
import numpy as np
from keras_hub.tokenizers import Tokenizer

from tfxl.backend import require_tensorflow
from tfxl.hub.presets import save_preset
from tfxl.private_apis import (canonicalize_python_string_inputs,
                               canonicalize_python_token_inputs, convert_to_ragged_batch,
                               preprocessing_function, restore_outer_shape)


def _tfxl_tokenizers():
    """`tfxl.data.tokenizers` (TensorFlow code: tf.data, tf.lookup), imported when a tokenizer is
    made, so that tfxl.hub's models import without TensorFlow."""
    require_tensorflow("tfxl.hub.TransfoXLTokenizer")
    from tfxl.data import tokenizers
    return tokenizers


@keras.saving.register_keras_serializable(package="tfxl")
class TransfoXLTokenizer(Tokenizer):
    """Tokenizes text with a tfxl tokenizer.

    Args:
      spec: the tfxl tokenizer's `spec()` (a JSON dict: type, vocabulary file and its sha256).
        A bytes tokenizer needs nothing else; the others load their vocabulary with
        `load_assets(dir)` (what `from_preset` does), or take it from `tokenizer`.
      tokenizer: optional, the tfxl tokenizer object itself (not serialized; `from_tfxl`).
    """

    def __init__(self, spec, tokenizer=None, **kwargs):
        kwargs.setdefault("dtype", "int32")
        super().__init__(**kwargs)
        self.spec = dict(spec)
        self.file_assets = _tfxl_tokenizers().spec_files(self.spec)
        self.tfxl_tokenizer = None
        if tokenizer is not None:
            self._set_tokenizer(tokenizer)
        elif not self.file_assets:
            self._set_tokenizer(_tfxl_tokenizers().tokenizer_from_spec(self.spec, ""))

    @classmethod
    def from_tfxl(cls, tokenizer, **kwargs):
        """The keras-hub tokenizer of a loaded tfxl tokenizer (e.g. `tfxl.data.tokenizers.
        load_tokenizer(data_dir)`)."""
        return cls(tokenizer.spec(), tokenizer=tokenizer, **kwargs)

    def _set_tokenizer(self, tokenizer):
        if tokenizer.spec() != self.spec:
            raise ValueError(f"tokenizer spec {tokenizer.spec()} does not match {self.spec}")
        self.tfxl_tokenizer = tokenizer

    def _loaded(self):
        if self.tfxl_tokenizer is None:
            raise ValueError(f"the {self.spec['type']} tokenizer has no vocabulary yet: load it "
                             "with from_preset() or load_assets(dir)")
        return self.tfxl_tokenizer

    # --- assets -------------------------------------------------------------------------------
    def save_assets(self, dir_path):
        self._loaded().save(dir_path)

    def load_assets(self, dir_path):
        self._set_tokenizer(_tfxl_tokenizers().tokenizer_from_spec(self.spec, dir_path))

    def load_preset_assets(self, preset):
        if self.file_assets:  # a bytes tokenizer has none, which keras-hub's method refuses
            super().load_preset_assets(preset)

    # --- vocabulary ---------------------------------------------------------------------------
    def vocabulary_size(self):
        return int(self.spec["vocab_size"])

    @property
    def pad_token_id(self):
        return self._loaded().pad_id

    @property
    def start_token_id(self):
        """`<eod>`: every document begins with it in tfxl's data."""
        return self._loaded().eod_id

    @property
    def end_token_id(self):
        """`<eod>` too: the next document's start ends the one before."""
        return self._loaded().eod_id

    @property
    def special_token_ids(self):
        """Ids `generate` strips from its text: padding and document boundaries."""
        return sorted({self.pad_token_id, self.start_token_id})

    # --- tokenize / detokenize ------------------------------------------------------------------
    def tokenize(self, inputs):
        if self._use_tf_workflow():
            return self._tokenize_tf(inputs)
        return self._tokenize_python(inputs)

    @preprocessing_function
    def _tokenize_tf(self, inputs):
        unbatched = inputs.shape.rank == 0
        ids = self._loaded().tf_encode(
            require_tensorflow("TransfoXLTokenizer").reshape(inputs, [-1]) if unbatched else inputs)
        return ids[0] if unbatched else ids

    def _tokenize_python(self, inputs):
        texts, batched, outer_shape = canonicalize_python_string_inputs(inputs)
        encode = self._loaded().encode
        ids = [encode(text).astype(np.int32).tolist() for text in texts]
        if outer_shape is not None:
            return restore_outer_shape(ids, outer_shape)
        return ids if batched else np.asarray(ids[0], np.int32)

    def detokenize(self, inputs):
        if self._use_tf_workflow():
            return self._detokenize_tf(inputs)
        return self._detokenize_python(inputs)

    @preprocessing_function
    def _detokenize_tf(self, inputs):
        ids, unbatched, _ = convert_to_ragged_batch(inputs)
        text = self._loaded().tf_decode(ids)
        return text[0] if unbatched else text

    def _detokenize_python(self, inputs):
        ids, batched = canonicalize_python_token_inputs(inputs)
        decode = self._loaded().decode
        texts = [decode(row) for row in ids]
        return texts if batched else texts[0]

    def save_to_preset(self, preset_dir):
        """keras-hub's `save_to_preset`, into a local directory or a bucket
        (`tfxl.hub.presets`)."""
        save_preset(super().save_to_preset, preset_dir)

    def get_config(self):
        return {**super().get_config(), "spec": self.spec}
