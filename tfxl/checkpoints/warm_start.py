"""`tfxl-train --init_checkpoint`: a new run that starts from another model's weights.

The source is a `.keras` file (e.g. `tfxl-convert`'s output of a published checkpoint), another
model_dir (its newest readable checkpoint; damaged ones are skipped as everywhere,
tfxl/checkpoints/finding.py), or a checkpoint prefix (`.../checkpoints/ckpt-N`); any of them
may be in a bucket (`gs://`): everything is read through tf.io.gfile (Keras reads remote
`.keras` files through it too). Only the model's weights are taken: the optimizer, the
training memory, the dropout seeds and the step start fresh, at step 0.

It applies to a model_dir without checkpoints only. A model_dir with checkpoints resumes from its
own newest one and the flag is ignored, with a note: the run's own checkpoint always wins, so
re-running the same command after an interruption continues the run instead of starting over.

Before anything is written to the model_dir, every variable of the model (the flags' model with
the data's vocabulary) is matched by its path in the object graph (`backbone/block_0/attention/
query_kernel`, the names of a training checkpoint's `model/` keys; the same on every backend,
tfxl/checkpoints/tree.py, so a checkpoint of a run on either backend starts a run on either) and
its shape against the source; what does not fit (other shapes, variables only on one side, a
different `pre_lnorm`, which changes no shape) is listed in one error line, with the vocabulary
sizes when they differ and the source's own config to build its model with.
"""

import os
import zipfile

from absl import flags

from tfxl.checkpoints.finding import (check_readable, checkpoints_newest_first,
                                      newest_readable_checkpoint)
from tfxl.checkpoints.training import MODEL
from tfxl.checkpoints.tree import checkpoint_shapes, read_checkpoint, variables_by_path
from tfxl.config import TransfoXLConfig
from tfxl.model_dir import LANGUAGE_MODEL, ModelDir, check_data_fingerprint, check_run_kind
from tfxl.deferred import deferred_import

keras = deferred_import("keras")
tf = deferred_import("tensorflow")

SHOWN = 6  # mismatches listed by name; the rest are counted


def define_flags():
    flags.DEFINE_string(
        "init_checkpoint", None,
        "Start a new run from these model weights: a .keras file (e.g. tfxl-convert's output), "
        "another model_dir (its newest readable checkpoint) or a checkpoint prefix "
        "(.../ckpt-N); local or gs://. Fresh optimizer, memory and step. Ignored (with a note) "
        "when --model_dir already has checkpoints: the run resumes from its own.")


def _shape(shape):
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


class Source:
    """A resolved --init_checkpoint: `path` (the .keras file or checkpoint prefix read),
    `shapes` {variable path: shape}, the source's `config` and `model_dir` when known."""

    def __init__(self, path, shapes, config=None, model_dir=None, config_file=None, model=None):
        self.path, self.shapes, self.config = path, shapes, config
        self.model_dir, self.config_file, self._model = model_dir, config_file, model

    def load_into(self, model):
        """Assigns the source's weights to every variable of `model` (which fits)."""
        if self._model is not None:  # a .keras model: copy variable by variable
            source = variables_by_path(self._model)
            for path, variable in variables_by_path(model).items():
                variable.assign(keras.ops.convert_to_numpy(source[path]))
        else:  # a training checkpoint (of any backend): its model part only
            read_checkpoint(self.path, "this model", **{MODEL: model})


def _source_model_dir(prefix):
    """The model_dir holding checkpoint `prefix` (model_dir/checkpoints/ckpt-N), or None."""
    directory = os.path.dirname(os.path.dirname(prefix))
    return directory if directory and ModelDir(directory).is_model_dir() else None


def _from_keras(path):
    if not tf.io.gfile.exists(path):
        raise ValueError(f"--init_checkpoint={path}: no such .keras file")
    try:
        model = keras.saving.load_model(path, compile=False)
    except (ValueError, OSError, KeyError, TypeError, zipfile.BadZipFile,
            tf.errors.OpError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ValueError(f"--init_checkpoint={path} is not a readable .keras file "
                         f"({type(err).__name__}: {reason})") from None
    shapes = {key: tuple(v.shape) for key, v in variables_by_path(model).items()}
    base = path[:-len(".keras")]
    config_file = base + ".config.json"  # tfxl-convert writes it beside the model
    config = getattr(model, "config", None)
    return Source(path, shapes, config if isinstance(config, TransfoXLConfig) else None, None,
                  config_file if tf.io.gfile.exists(config_file) else None, model)


def _from_checkpoint(prefix):
    shapes = checkpoint_shapes(prefix, MODEL)
    if not shapes:
        raise ValueError(f"--init_checkpoint={prefix} holds no tfxl model (no `model/` "
                         "variables); convert a published checkpoint with tfxl-convert and "
                         "pass the .keras file")
    model_dir = _source_model_dir(prefix)
    config_file = ModelDir(model_dir).config if model_dir else None
    config = TransfoXLConfig.from_file(config_file) if config_file else None
    return Source(prefix, shapes, config, model_dir, config_file)


def resolve(path, log=print):
    """The `Source` of --init_checkpoint=`path`; ValueError when there is none to read."""
    if path.endswith(".keras"):
        return _from_keras(path)
    if tf.io.gfile.isdir(path):
        check_run_kind(path, LANGUAGE_MODEL, "warm-start from a tfxl-train model_dir or a "
                       "language model's .keras file", flag="--init_checkpoint")
        layout = ModelDir(path)
        directory = layout.checkpoints if tf.io.gfile.isdir(layout.checkpoints) else path
        prefix = newest_readable_checkpoint(directory, log)
        if prefix is None:
            raise ValueError(f"--init_checkpoint={path}: no checkpoint in {directory}")
        return _from_checkpoint(prefix)
    if tf.io.gfile.exists(f"{path}.index"):
        return _from_checkpoint(check_readable(path))
    raise ValueError(f"--init_checkpoint={path} not found: give a .keras file, a model_dir or a "
                     "checkpoint prefix (.../ckpt-N)")


def mismatches(source, shapes, config):
    """What of `source` does not fit a model with variable `shapes` built from `config`: one
    phrase per variable (in the model's order, then those only in the source)."""
    found = []
    for path, shape in shapes.items():
        theirs = source.shapes.get(path)
        if theirs is None:
            found.append(f"{path} {_shape(shape)} is not in it")
        elif tuple(theirs) != tuple(shape):
            found.append(f"{path} is {_shape(theirs)} there, {_shape(shape)} here")
    found += [f"{path} {_shape(shape)} is only there" for path, shape in source.shapes.items()
              if path not in shapes]
    if source.config is not None and source.config.pre_lnorm != config.pre_lnorm:
        found.append(f"pre_lnorm is {source.config.pre_lnorm} there, {config.pre_lnorm} here")
    return found


def check_fits(source, model, config, data_dir):
    """ValueError listing what of `source` does not fit `model` (built from `config`, whose
    vocabulary is --data_dir's)."""
    shapes = {path: tuple(v.shape) for path, v in variables_by_path(model).items()}
    found = mismatches(source, shapes, config)
    if not found:
        return
    shown = "; ".join(found[:SHOWN]) + (f"; and {len(found) - SHOWN} more"
                                        if len(found) > SHOWN else "")
    hints = []
    theirs = source.shapes.get("softmax/bias")
    if theirs and int(theirs[0]) != config.vocab_size:
        hints.append(f"its vocabulary has {int(theirs[0])} tokens, --data_dir={data_dir} has "
                     f"{config.vocab_size}: prepare the data with the checkpoint's vocabulary")
    if source.config_file:
        hints.append(f"its model is --config={source.config_file}")
    raise ValueError(f"--init_checkpoint={source.path} does not fit the model "
                     f"({len(found)} of its variables or settings differ): {shown}"
                     + "".join(f". {hint[0].upper()}{hint[1:]}" for hint in hints))


def warm_start(init_checkpoint, model, model_dir, manifest, data_dir, log=print, load=True):
    """Loads `init_checkpoint`'s weights into `model` when `model_dir` has no checkpoint yet;
    returns the path read, or None (no flag, or the run resumes and the flag is ignored).
    load=False checks only (tfxl-train --dry_run).

    Writes nothing: call it before the model_dir is claimed, so that a source that does not fit
    leaves no trace there.
    """
    if not init_checkpoint:
        return None
    if checkpoints_newest_first(ModelDir(model_dir).checkpoints):
        log(f"note: --init_checkpoint={init_checkpoint} is ignored: {model_dir} has checkpoints "
            "of its own and the run resumes from them")
        return None
    source = resolve(init_checkpoint, log)
    check_fits(source, model, model.config, data_dir)
    if source.model_dir and tf.io.gfile.exists(ModelDir(source.model_dir).data):
        check_data_fingerprint(source.model_dir, manifest, data_dir)  # same size, other tokens
    if (source.config is not None
            and source.config.layer_norm_epsilon != model.config.layer_norm_epsilon):
        log(f"note: --init_checkpoint={source.path} was trained with layer_norm_epsilon "
            f"{source.config.layer_norm_epsilon}, this model uses "
            f"{model.config.layer_norm_epsilon} (--layer_norm_epsilon)")
    if not load:
        log(f"warm start: {source.path} fits this model")
        return source.path
    source.load_into(model)
    log(f"warm start: model weights from {source.path} (optimizer, memory and step start "
        "fresh)")
    return source.path
