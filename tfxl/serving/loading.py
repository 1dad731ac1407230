"""Loading a trained language model from a `.keras` file or a training model_dir."""

import os

import keras

from tfxl.checkpoints import restore_weights
from tfxl.config import TransfoXLConfig
from tfxl.data.manifest import load_manifest
from tfxl.data.tokenizers import load_tokenizer
from tfxl.model_dir import ModelDir, check_data_fingerprint, check_vocab_size
from tfxl.models import TransfoXLLM


def load_checked_tokenizer(data_dir, model_source, vocab_size):
    """The tokenizer of `data_dir` once it is known to be the model's vocabulary: the same size
    (vocab_size None: unknown) and, for a model_dir or an export, the vocabulary hash recorded
    there. Another vocabulary of the same size would silently give wrong text."""
    manifest = load_manifest(data_dir)
    check_vocab_size(manifest, data_dir, vocab_size, model_source)
    if os.path.isdir(model_source):
        check_data_fingerprint(model_source, manifest, data_dir)
    return load_tokenizer(data_dir, manifest)


def load_language_model(source, checkpoint=None, log=None):
    """A TransfoXLLM from `source`: a `.keras` file, or a model_dir (config.json + checkpoints/).

    `checkpoint` must read cleanly; without it the newest readable checkpoint is used and damaged
    newer ones are reported through `log` (default stderr). Raises ValueError naming the file
    when it is missing, damaged or does not fit.
    """
    if source.endswith(".keras"):
        if not os.path.isfile(source):
            raise ValueError(f"{source}: no such .keras file")
        try:
            model = keras.saving.load_model(source)
        except (ValueError, OSError, KeyError, TypeError) as err:
            raise ValueError(f"{source} is not a valid .keras file ({type(err).__name__}: "
                             f"{str(err).splitlines()[0] if str(err) else ''})") from None
        if not isinstance(model, TransfoXLLM):
            raise ValueError(f"{source} holds a {type(model).__name__}, not a TransfoXLLM")
        return model
    layout = ModelDir(source)
    config_path = layout.config
    if not os.path.isfile(config_path):
        raise ValueError(f"{config_path} not found; pass a .keras file or a model_dir written by "
                         "tfxl-train")
    config = TransfoXLConfig.from_file(config_path)
    model = TransfoXLLM(config)
    model.build((None, config.tgt_len))
    restore_weights(model, checkpoint, layout.checkpoints, fits=config_path,
                    log=log)
    return model
