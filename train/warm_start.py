"""`tfxl-train --init_checkpoint`: a new run that starts from another model's weights.

The source is a `.keras` file (e.g. `tfxl-convert`'s output of a published checkpoint), another
model_dir (its newest readable checkpoint; damaged ones are skipped as everywhere,
tfxl/checkpoints.py), or a checkpoint prefix (`.../checkpoints/ckpt-N`); any of them may be in a
bucket (`gs://`): everything is read through tf.io.gfile (Keras reads remote `.keras` files
through it too). Only the model's weights are taken: the optimizer, the training memory, the
dropout seeds and the step start fresh, at step 0.

It applies to a model_dir without checkpoints only. A model_dir with checkpoints resumes from its
own newest one and the flag is ignored, with a note: the run's own checkpoint always wins, so
re-running the same command after an interruption continues the run instead of starting over.

Before anything is written to the model_dir, every variable of the model (the flags' model with
the data's vocabulary) is matched by its path in the object graph (`backbone/block_0/attention/
query_kernel`, the names of a training checkpoint's `model/` keys) and its shape against the
source; what does not fit (other shapes, variables only on one side, a different `pre_lnorm`,
which changes no shape) is listed in one error line, with the vocabulary sizes when they differ
and the source's own config to build its model with.
"""

import os
import zipfile

from absl import flags

from tfxl.checkpoints import (check_readable, checkpoints_newest_first,
                              newest_readable_checkpoint, restore_fitting)
from tfxl.config import TransfoXLConfig
from tfxl.model_dir import ModelDir, check_data_fingerprint
from tfxl.deferred import deferred_import

keras = deferred_import("keras")
tf = deferred_import("tensorflow")

MODEL = "model"  # what a training checkpoint (train/checkpointing.py) calls the model
OBJECT_GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"
SHOWN = 6  # mismatches listed by name; the rest are counted


def define_flags():
    flags.DEFINE_string(
        "init_checkpoint", None,
        "Start a new run from these model weights: a .keras file (e.g. tfxl-convert's output), "
        "another model_dir (its newest readable checkpoint) or a checkpoint prefix "
        "(.../ckpt-N); local or gs://. Fresh optimizer, memory and step. Ignored (with a note) "
        "when --model_dir already has checkpoints: the run resumes from its own.")


def model_variables(model):
    """{path: variable} of `model`'s weights, each path its place in the object graph that
    `tf.train.Checkpoint(model=model)` saves (e.g. `backbone/block_0/feed_forward/inner/_kernel`:
    attribute names, not Keras' layer names)."""
    found = {}

    def walk(obj, prefix):
        for name, child in tf.train.TrackableView.children(obj).items():
            if isinstance(child, (tf.Variable, keras.Variable)):
                found.setdefault(prefix + name, child)
            else:
                walk(child, f"{prefix}{name}/")

    walk(model, "")
    return found


def checkpoint_model_shapes(reader):
    """{path: shape} of the model's variables in a training checkpoint, with the paths of
    `model_variables`; None when it holds no `model`.

    The keys of a checkpoint do not say: each variable is stored under the shortest path that
    reaches it, which for a training checkpoint is the optimizer's list of the variables it
    trains. The object graph the checkpoint carries does: it is walked from its `model` node.
    """
    if not reader.has_tensor(OBJECT_GRAPH):  # a TF1 checkpoint: names only
        return None
    from tensorflow.core.protobuf import trackable_object_graph_pb2
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor(OBJECT_GRAPH))
    root = {child.local_name: child.node_id for child in graph.nodes[0].children}
    if MODEL not in root:
        return None
    shapes, tensor_shapes = {}, reader.get_variable_to_shape_map()

    def walk(node_id, prefix, seen):
        node = graph.nodes[node_id]
        for attribute in node.attributes:
            if attribute.name == "VARIABLE_VALUE":
                shapes.setdefault(prefix.rstrip("/"),
                                  tuple(tensor_shapes[attribute.checkpoint_key]))
        for child in node.children:
            if child.node_id not in seen:
                walk(child.node_id, f"{prefix}{child.local_name}/", seen | {child.node_id})

    walk(root[MODEL], "", {root[MODEL]})
    return shapes


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
            source = model_variables(self._model)
            for path, variable in model_variables(model).items():
                variable.assign(source[path].numpy())
        else:  # a training checkpoint: its model part only
            restore_fitting(tf.train.Checkpoint(model=model), self.path, "this model",
                            partial=True)


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
    shapes = {key: tuple(v.shape) for key, v in model_variables(model).items()}
    base = path[:-len(".keras")]
    config_file = base + ".config.json"  # tfxl-convert writes it beside the model
    config = getattr(model, "config", None)
    return Source(path, shapes, config if isinstance(config, TransfoXLConfig) else None, None,
                  config_file if tf.io.gfile.exists(config_file) else None, model)


def _from_checkpoint(prefix):
    shapes = checkpoint_model_shapes(tf.train.load_checkpoint(prefix))
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
    shapes = {path: tuple(v.shape) for path, v in model_variables(model).items()}
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
