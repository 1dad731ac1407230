"""Loading trained models: a language model from a `.keras` file or a training model_dir, any
tfxl model from a `.keras` file, a data dir's tokenizer or labels once they fit the model, and
telling what a `--model` path holds. Every path may be a bucket (gs://...): tf.io.gfile
throughout.

Classification, keras-hub, serving and training import this module; it imports the model
(tfxl.models.language_model), the rest of this package and the data manifests, never any of
them, and tfxl/models/ never imports it (a classifier is read through its attributes:
num_classes, config)."""

import os
import zipfile
import zlib

import keras
import tensorflow as tf

from tfxl.checkpoints.tree import restore_weights
from tfxl.config import TransfoXLConfig
from tfxl.data.manifest import CLASSIFICATION, load_manifest
from tfxl.data.tokenizers import load_tokenizer
from tfxl.model_dir import (EXPORT_RECORD, LANGUAGE_MODEL, SAVED_MODEL, ModelDir,
                            check_data_fingerprint, check_run_kind, check_vocab_size)
from tfxl.models import LANGUAGE_MODELS, TransfoXLLM, build_language_model

KERAS, EXPORT, MODEL_DIR = "keras", "export", "model_dir"


def model_kind(source, trainer="tfxl-train"):
    """What `source` holds: KERAS (a `.keras` file), EXPORT (a SavedModel version directory,
    saved_model.pb present) or MODEL_DIR (config.json present). ValueError naming what is
    missing otherwise (`trainer`: the tool whose model_dir the caller reads); an export
    directory without saved_model.pb is still being published or was interrupted, and is never
    loaded. Which kind of run a MODEL_DIR holds is `tfxl.model_dir.check_run_kind`'s."""
    if source.endswith(".keras"):
        if not tf.io.gfile.exists(source) or tf.io.gfile.isdir(source):
            raise ValueError(f"{source}: no such .keras file")
        return KERAS
    if tf.io.gfile.exists(os.path.join(source, SAVED_MODEL)):
        return EXPORT
    if tf.io.gfile.exists(ModelDir(source).config):
        return MODEL_DIR
    if any(tf.io.gfile.exists(os.path.join(source, name))
           for name in ("variables", EXPORT_RECORD)):
        raise ValueError(f"{source} is an export without {SAVED_MODEL}: still being published, "
                         "or its publishing was interrupted; use a complete version")
    raise ValueError(f"{ModelDir(source).config} not found; pass a .keras file or a model_dir "
                     f"written by {trainer}")


def load_checked_tokenizer(data_dir, model_source, vocab_size):
    """The tokenizer of `data_dir` once it is known to be the model's vocabulary: the same size
    (vocab_size None: unknown) and, for a model_dir or an export, the vocabulary hash recorded
    there. Another vocabulary of the same size would silently give wrong text."""
    manifest = load_manifest(data_dir)
    check_vocab_size(manifest, data_dir, vocab_size, model_source)
    if not model_source.endswith(".keras"):  # a model_dir or an export, local or a bucket
        check_data_fingerprint(model_source, manifest, data_dir)
    return load_tokenizer(data_dir, manifest)


def _not_a_zip(path):
    """Why the file `path` is not a zip archive (Keras says "File not found" for a truncated
    .keras file), or None when it is one."""
    try:
        with tf.io.gfile.GFile(path, "rb") as f, zipfile.ZipFile(f):
            return None
    except zipfile.BadZipFile as err:
        return f"not a zip archive: {err}; truncated, or not a .keras file"
    except (OSError, tf.errors.OpError):
        return None  # unreadable: Keras' own reason says more


def load_keras_model(path, model_class):
    """The `model_class` model (a class or a tuple of them) in the .keras file `path`;
    ValueError naming the file when it is missing, damaged (a truncated file said so) or holds
    another model."""
    try:
        # Keras reads a remote .keras file through tf.io.gfile (a copy in a local temporary
        # directory, removed after loading).
        model = keras.saving.load_model(path)
    except (zipfile.BadZipFile, zlib.error, EOFError) as err:
        # An archive whose members fail their CRC-32 or do not inflate: a flipped byte, a copy
        # cut short in a member. (Keras reads members lazily, so this surfaces while loading.)
        raise ValueError(f"{path} is not a valid .keras file (damaged: {err}); copy or write "
                         "it again") from None
    except (ValueError, OSError, KeyError, TypeError, tf.errors.OpError) as err:
        reason = (_not_a_zip(path) or f"{type(err).__name__}: "
                  f"{str(err).splitlines()[0] if str(err) else ''}")
        raise ValueError(f"{path} is not a valid .keras file ({reason})") from None
    if not isinstance(model, model_class):
        wanted = model_class if isinstance(model_class, tuple) else (model_class,)
        raise ValueError(f"{path} holds a {type(model).__name__}, not a "
                         f"{' or a '.join(c.__name__ for c in wanted)}")
    return model


def check_classifier_fits(model, manifest, model_source, data_dir):
    """A document classifier fits a classification data dir's manifest: one class per label,
    and every token id of the data inside its vocabulary. ValueError naming both otherwise."""
    labels = manifest["labels"]
    if len(labels) != model.num_classes:
        raise ValueError(f"--model={model_source} has {model.num_classes} classes, --data_dir="
                         f"{data_dir} {len(labels)} labels ({', '.join(labels)})")
    if manifest["vocab_size"] > model.config.vocab_size:
        raise ValueError(f"--data_dir={data_dir} has token ids up to "
                         f"{manifest['vocab_size'] - 1}, --model={model_source} a vocabulary of "
                         f"{model.config.vocab_size} (another tokenizer)")


def load_classifier_data(data_dir, model, model_source):
    """(tokenizer, label names) of the classification data dir `data_dir` (local or gs://),
    once it is known to fit the classifier `model` (`check_classifier_fits`)."""
    manifest = load_manifest(data_dir, kind=CLASSIFICATION)
    check_classifier_fits(model, manifest, model_source, data_dir)
    return load_tokenizer(data_dir, manifest), list(manifest["labels"])


def classifier_file(source):
    """The .keras file of the document classifier at `source`: `source` itself (a .keras file,
    or any other file, which loading then judges), or a tfxl-classify-train model_dir's
    classifier.keras. ValueError saying what to give otherwise: an export, a language model's
    model_dir, a run that has not finished."""
    if source.endswith(".keras") or (tf.io.gfile.exists(source)
                                     and not tf.io.gfile.isdir(source)):
        return source
    kind = model_kind(source, trainer="tfxl-classify-train")
    if kind == EXPORT:
        raise ValueError(f"{source} is an exported SavedModel; give the classifier's .keras "
                         "file or its tfxl-classify-train model_dir")
    layout = ModelDir(source)
    check_run_kind(source, CLASSIFICATION, "give a document classifier: its .keras file or "
                   "its tfxl-classify-train model_dir")
    if not tf.io.gfile.exists(layout.classifier):
        raise ValueError(f"{source} has no {os.path.basename(layout.classifier)} yet: "
                         "tfxl-classify-train writes it there when its run finishes; finish "
                         "the run, or give a .keras file")
    return layout.classifier


def load_language_model(source, checkpoint=None, log=None, any_architecture=False):
    """A language model from `source`: a `.keras` file, or a model_dir (config.json +
    checkpoints/; its architecture's class, `tfxl.models.build_language_model`).

    `checkpoint` must read cleanly; without it the newest readable checkpoint is used and damaged
    newer ones are reported through `log` (default stderr). Raises ValueError naming the file
    when it is missing, damaged or does not fit. With `any_architecture`, a baseline's model
    (`TransformerLM`, `LSTMLM`: config.json's architecture) too; without it, a baseline is
    refused with one line (export, generation, conversion and classification are
    Transformer-XL's).
    """
    kind = model_kind(source)
    if kind == EXPORT:
        raise ValueError(f"{source} is an exported SavedModel; this needs a .keras file or a "
                         "model_dir written by tfxl-train")
    if kind == KERAS:
        model = load_keras_model(source, tuple(LANGUAGE_MODELS.values()))
        check_architecture(source, model.config, any_architecture)
        return model
    check_run_kind(source, LANGUAGE_MODEL, "this needs a language model (a .keras file or a "
                   "tfxl-train model_dir); the classifier itself is "
                   f"{ModelDir(source).classifier}, for tfxl-classify-eval and tfxl-export")
    layout = ModelDir(source)
    config = TransfoXLConfig.from_file(layout.config)
    check_architecture(source, config, any_architecture)
    model = build_language_model(config)
    restore_weights(model, checkpoint, layout.checkpoints, fits=layout.config, log=log)
    return model


def check_architecture(source, config, any_architecture=False):
    """ValueError where `source` holds a baseline (config.architecture other than
    transformer_xl) and only Transformer-XL models are read."""
    if not any_architecture and config.architecture != TransfoXLLM.architecture:
        raise ValueError(f"{source} holds a {config.architecture!r} model (a baseline); this "
                         "reads Transformer-XL models only (architecture 'transformer_xl')")
