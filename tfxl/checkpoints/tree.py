"""TensorFlow checkpoints of Keras objects on any backend, so that every tool reads one format.

On TensorFlow, `tf.train.Checkpoint(model=..., optimizer=...)` names each variable by the path of
attributes that reaches it (`model/backbone/block_0/attention/query_kernel`,
`optimizer/_variables/3`): Keras' TensorFlow layers and optimizers are trackable, and their
attributes are their children. On JAX they are not trackable, but they have the same attributes
(the model code is the same). `CheckpointTree` walks those attributes as TensorFlow does and
mirrors every variable reached in a `tf.Variable` at the same path, so a training run on JAX
writes checkpoints that tfxl-eval, tfxl-export and tfxl-generate restore as they restore a
TensorFlow run's, and `read_checkpoint` reads any of them back by the same paths (a TensorFlow
run's weights warm-start a JAX run). `restore_weights` is the one weight-only restore of a model
(evaluation, export, generation), on any backend.

What the walk leaves out is what Keras keeps out of TensorFlow's object graph: a layer's own
tracking lists (`_layers`, `_trainable_variables`, ...), which alias attributes already walked,
and TensorFlow's bookkeeping attributes (`_self_*`). tests/test_checkpoint_tree.py checks the
walk against the graph TensorFlow writes. Integer variables are stored as int64, as Keras'
TensorFlow backend stores them (JAX's are int32, uint32 for seeds); they are cast back on read.
"""

import functools

import numpy as np

from tfxl.checkpoints.finding import check_readable, newest_readable_checkpoint
from tfxl import backend
from tfxl.deferred import deferred_import

keras = deferred_import("keras")  # imported on use: the tools' --help imports this module
tf = deferred_import("tensorflow")

# A Keras layer's tracking lists, created where TensorFlow does not track attributes.
_LAYER_TRACKER = frozenset({"_layers", "_trainable_variables", "_non_trainable_variables",
                            "_metrics", "_seed_generators", "_tracker"})
_OBJECT_GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"  # the key of the graph of names in a checkpoint


@functools.cache
def _keras_objects():
    return keras.Variable, keras.layers.Layer, keras.optimizers.Optimizer


def _holds_keras(value):
    if isinstance(value, _keras_objects()):
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds_keras(item) for item in value)
    if isinstance(value, dict):
        return any(_holds_keras(item) for item in value.values())
    return False


def _children(obj):
    if isinstance(obj, (list, tuple)):
        return [(str(i), value) for i, value in enumerate(obj)]
    if isinstance(obj, dict):
        return [(str(key), value) for key, value in obj.items()]
    skip = _LAYER_TRACKER if isinstance(obj, keras.layers.Layer) else ()
    return [(name, value) for name, value in vars(obj).items()
            if name not in skip and not name.startswith("_self_")]


def variable_paths(**roots):
    """{id(variable): (variable, [path, ...])} for every Keras variable reachable from `roots`
    (name -> layer, optimizer, variable, or list of them), each path as TensorFlow's checkpoint
    names it ("model/backbone/content_bias"), in the order of the walk."""
    found, visited = {}, set()

    def walk(obj, path):
        for name, value in _children(obj):
            if not _holds_keras(value):
                continue
            child = f"{path}/{name}" if path else name
            if isinstance(value, keras.Variable):
                found.setdefault(id(value), (value, []))[1].append(child)
            elif isinstance(value, (list, tuple, dict)) or id(value) not in visited:
                visited.add(id(value))
                walk(value, child)

    walk(roots, "")
    return found


def variables_by_path(root):
    """{path: variable} of every Keras variable reachable from `root`, under every path that
    reaches it, each path as a checkpoint of `root` alone names it less the root's own name
    (`backbone/block_0/attention/query_kernel`, a model's `model/...` keys)."""
    return {path.split("/", 1)[1]: variable
            for variable, paths in variable_paths(root=root).values() for path in paths}


def _stored_dtype(dtype):
    name = keras.backend.standardize_dtype(dtype)
    return "int64" if name.startswith(("int", "uint")) else name


class CheckpointTree:
    """`tf.Variable` mirrors of the Keras variables reachable from `roots`, tracked at the paths
    TensorFlow gives them: `trackables` goes into a `tf.train.Checkpoint`; `pull()` copies the
    Keras values in before each save.

    Args:
      roots: name -> layer, optimizer, variable or list of variables (e.g. model=, optimizer=,
        rng=[seed states]).
      to_numpy: a Keras variable's value as a host array (default `keras.ops.convert_to_numpy`;
        a multi-host run passes one that gathers its shards).
    """

    def __init__(self, to_numpy=None, **roots):
        self.to_numpy = to_numpy or (lambda variable: keras.ops.convert_to_numpy(variable.value))
        self._mirrors = {}  # id(keras variable) -> (keras variable, tf.Variable)
        self._nodes = {}  # id(layer, optimizer, list, ...) -> its node: one per object
        with tf.device("/cpu:0"):
            self.trackables = {name: self._node(root, name) for name, root in roots.items()}

    def _node(self, obj, path):
        if isinstance(obj, keras.Variable):
            if id(obj) not in self._mirrors:
                self._mirrors[id(obj)] = (obj, tf.Variable(
                    tf.zeros(obj.shape, _stored_dtype(obj.dtype)), trainable=False))
            return self._mirrors[id(obj)][1]
        if id(obj) in self._nodes:  # reached again (or a cycle): the same node, as in TF
            return self._nodes[id(obj)]
        # A list's items are "0", "1", ...: the names TensorFlow's list wrapper gives them.
        node = self._nodes[id(obj)] = tf.Module()
        for name, value in _children(obj):
            if _holds_keras(value):
                setattr(node, name, self._node(value, f"{path}/{name}"))
        return node

    def pull(self):
        """Copies every Keras variable's value into its mirror (before a save)."""
        for variable, mirror in self._mirrors.values():
            mirror.assign(np.asarray(self.to_numpy(variable)).astype(mirror.dtype.as_numpy_dtype))


def checkpoint_paths(path):
    """(reader, {path: checkpoint key}) of every variable a checkpoint holds, each under every
    path of attributes that reaches it (TensorFlow stores one key per variable, and the graph of
    names); no paths for a checkpoint without that graph (TensorFlow 1's)."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2
    reader = tf.train.load_checkpoint(path)
    if not reader.has_tensor(_OBJECT_GRAPH):  # a TF1 checkpoint: names only, no paths
        return reader, {}
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor(_OBJECT_GRAPH))
    keys, queue, seen = {}, [(0, "")], set()
    while queue:
        node_id, prefix = queue.pop()
        node = graph.nodes[node_id]
        for attribute in node.attributes:
            if attribute.name == "VARIABLE_VALUE":
                keys[prefix] = attribute.checkpoint_key
        if (node_id, prefix) in seen or prefix.count("/") > 64:  # a cycle
            continue
        seen.add((node_id, prefix))
        for child in node.children:
            queue.append((child.node_id, f"{prefix}/{child.local_name}" if prefix
                          else child.local_name))
    return reader, keys


def checkpoint_shapes(path, root):
    """{path: shape} of the variables under `root` ("model") in the checkpoint `path`, each path
    as `variables_by_path` gives it; empty when the checkpoint holds no `root`."""
    reader, keys = checkpoint_paths(path)
    shapes, prefix = reader.get_variable_to_shape_map(), f"{root}/"
    return {name[len(prefix):]: tuple(shapes[key]) for name, key in keys.items()
            if name.startswith(prefix)}


def read_checkpoint(path, fits, *, arrays=None, **roots):
    """Assigns every Keras variable reachable from `roots` its value in the checkpoint `path`
    (written on any backend), found by the paths TensorFlow names it by; returns the values of
    `arrays` ({path: shape}, e.g. a training memory's "memory/states"), read with the same
    checks. ValueError naming the first variable or array the checkpoint lacks or holds in
    another shape (`fits`: what the model was built from, for the message); nothing is assigned
    unless everything fits."""
    reader, keys = checkpoint_paths(path)
    shapes = reader.get_variable_to_shape_map()

    def value(paths, shape):
        key = next((keys[p] for p in paths if p in keys), None)
        if key is None:
            raise ValueError(f"checkpoint {path} does not fit {fits}: it has no {paths[0]}")
        if tuple(shapes[key]) != tuple(shape):
            raise ValueError(f"checkpoint {path} does not fit {fits}: {paths[0]} is "
                             f"{list(shapes[key])} there, {list(shape)} here")
        return reader.get_tensor(key)

    values = [(variable, value(paths, variable.shape))
              for variable, paths in variable_paths(**roots).values()]
    read = {name: value([name], shape) for name, shape in (arrays or {}).items()}
    for variable, array in values:
        variable.assign(array.astype(keras.backend.standardize_dtype(variable.dtype)))
    return read


def restore_weights(model, checkpoint=None, directory=None, fits="this model", log=None):
    """Restores only `model`'s weights (not the optimizer, step or memory a training checkpoint
    also holds) for evaluation, export or generation, on any Keras backend; returns the
    checkpoint path.

    From `checkpoint`, which must read cleanly, else from the newest readable checkpoint in
    `directory` (damaged newer ones reported through `log`). ValueError when there is none, or
    when it does not fit `fits` (what the model was built from, for the message).
    """
    path = check_readable(checkpoint) if checkpoint else newest_readable_checkpoint(directory, log)
    if not path:
        raise ValueError(f"no checkpoint in {directory}")
    if backend.current().VARIABLES_ARE_TRACKABLE:
        restore_fitting(tf.train.Checkpoint(model=model), path, fits, partial=True)
    else:  # a Keras model of another backend, read by the paths TensorFlow names it by
        read_checkpoint(path, fits, model=model)
    return path


def restore_fitting(checkpoint, path, fits, partial=False):
    """`checkpoint.restore(path)` (`partial`: read only what `checkpoint` tracks, e.g. the
    model's weights out of a training checkpoint), every object it tracks matched; ValueError
    "checkpoint … does not fit `fits`: <first line of the reason>" otherwise."""
    try:
        status = checkpoint.read(path).expect_partial() if partial else checkpoint.restore(path)
        status.assert_existing_objects_matched()
    except (tf.errors.OpError, AssertionError, ValueError) as err:
        raise ValueError(f"checkpoint {path} does not fit {fits}: "
                         f"{str(err).splitlines()[0]}") from None
