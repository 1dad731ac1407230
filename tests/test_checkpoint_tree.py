"""TensorFlow-format checkpoints of Keras objects on any backend (tfxl/checkpoints/tree.py): the
walk names every variable by the path TensorFlow's object graph gives it, a `CheckpointTree`'s
checkpoint restores as a `tf.train.Checkpoint` of the model and optimizer does, a checkpoint
written on JAX restores on TensorFlow and the other way round, and `read_checkpoint` assigns
nothing from a checkpoint that does not fit."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import factories
from backends import JAX_XLA_FLAGS
from tfxl import TransfoXLLM
from tfxl.checkpoints.tree import (CheckpointTree, checkpoint_paths, checkpoint_shapes,
                                   read_checkpoint, restore_weights, variable_paths,
                                   variables_by_path)
from tfxl.train.loop.optimization import OptimizerParams, make_optimizer

TESTS = os.path.dirname(os.path.abspath(__file__))


def model_and_optimizer(config, optimizer="adam", mixed_precision="float32"):
    """A built `config` model and the trainer's optimizer, built for it: "tiny", or "adaptive"
    with dropout (seed generators, whose states TensorFlow's object graph does not hold)."""
    keras.config.set_dtype_policy(mixed_precision)
    if config == "tiny":
        model = factories.tiny_lm()
    else:
        model = TransfoXLLM(factories.adaptive_config(dropout=0.1, dropatt=0.1))
        model.build((None, model.config.tgt_len))
    optimizer, _ = make_optimizer(OptimizerParams(optimizer=optimizer), mixed_precision)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def take_a_step(model, optimizer, seed=0):
    """One optimizer step on random gradients: the slots and the step count are no longer zero."""
    rng = np.random.default_rng(seed)
    optimizer.apply([rng.normal(size=v.shape).astype("float32")
                     for v in model.trainable_variables], model.trainable_variables)


def values(**roots):
    """{first path: value} of every variable reachable from `roots`."""
    return {paths[0]: np.asarray(keras.ops.convert_to_numpy(variable.value))
            for variable, paths in variable_paths(**roots).values()}


def assert_same_values(got, want):
    assert sorted(got) == sorted(want)
    for path, value in want.items():
        np.testing.assert_array_equal(got[path], value, err_msg=path)


@pytest.mark.parametrize("mixed_precision", ["float32", "mixed_float16"])
@pytest.mark.parametrize("optimizer", ["adam", "lamb"])
@pytest.mark.parametrize("config", ["tiny", "adaptive"])
def test_the_walk_finds_the_paths_of_tensorflows_object_graph(tmp_path, config, optimizer,
                                                              mixed_precision):
    """Every path of a variable in the graph `tf.train.Checkpoint(model=, optimizer=)` writes is
    a path of the walk and no other (the checkpoint's own save counter aside), the optimizer's
    lists of the variables it trains and a loss-scale optimizer's inner optimizer included."""
    model, optimizer = model_and_optimizer(config, optimizer, mixed_precision)
    path = tf.train.Checkpoint(model=model, optimizer=optimizer).save(str(tmp_path / "ckpt"))
    _, keys = checkpoint_paths(path)
    walked = {p for _, paths in variable_paths(model=model, optimizer=optimizer).values()
              for p in paths}
    assert walked == set(keys) - {"save_counter"}
    assert checkpoint_shapes(path, "model") == {
        p: tuple(v.shape) for p, v in variables_by_path(model).items()}


def test_the_walk_finds_the_paths_of_a_keras_model_with_non_trainable_weights(tmp_path):
    """Batch normalization's moving statistics, in its attributes and in the layer's list of
    non-trainable variables, by their attribute paths only, as TensorFlow names them."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                              keras.layers.BatchNormalization(), keras.layers.Dropout(0.2)])
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    path = tf.train.Checkpoint(model=model, optimizer=optimizer).save(str(tmp_path / "ckpt"))
    _, keys = checkpoint_paths(path)
    walked = {p for _, paths in variable_paths(model=model, optimizer=optimizer).values()
              for p in paths}
    assert walked == set(keys) - {"save_counter"}
    assert "model/_functional/_operations/2/moving_mean" in walked


@pytest.mark.parametrize("config,optimizer,mixed_precision", [
    ("tiny", "adam", "float32"), ("adaptive", "lamb", "mixed_float16")])
def test_a_tree_checkpoint_restores_as_a_tensorflow_checkpoint(tmp_path, config, optimizer,
                                                               mixed_precision):
    """A `CheckpointTree` of a model and its optimizer, pulled and saved, restores into a fresh
    model and optimizer through `tf.train.Checkpoint` with every object matched: the weights,
    the slots, the step count and the loss scale are the saved ones."""
    model, trained = model_and_optimizer(config, optimizer, mixed_precision)
    take_a_step(model, trained)
    tree = CheckpointTree(model=model, optimizer=trained)
    tree.pull()
    path = tf.train.Checkpoint(**tree.trackables).save(str(tmp_path / "tree" / "ckpt"))

    fresh, restored = model_and_optimizer(config, optimizer, mixed_precision)
    tf.train.Checkpoint(model=fresh, optimizer=restored).restore(
        path).assert_existing_objects_matched()
    assert int(restored.iterations.numpy()) == 1
    assert_same_values(values(model=fresh, optimizer=restored),
                       values(model=model, optimizer=trained))


# -- across backends ------------------------------------------------------------------------------

# The child, on JAX: saves a tree of a tiny model and its optimizer after a step (and the values
# it saved), and reads the checkpoint TensorFlow wrote into a fresh one (and the values it read).
ON_JAX = """
import sys
import keras, numpy as np, tensorflow as tf
tests, work, written_on_tensorflow = sys.argv[1:4]
sys.path.insert(0, tests)
from test_checkpoint_tree import model_and_optimizer, take_a_step, values
from tfxl.checkpoints.tree import CheckpointTree, read_checkpoint
assert keras.backend.backend() == "jax", keras.backend.backend()
keras.utils.set_random_seed(7)

model, optimizer = model_and_optimizer("tiny")
take_a_step(model, optimizer, seed=1)
tree = CheckpointTree(model=model, optimizer=optimizer)
tree.pull()
print(tf.train.Checkpoint(**tree.trackables).save(f"{work}/written_on_jax/ckpt"))
np.savez(f"{work}/saved_on_jax.npz", **values(model=model, optimizer=optimizer))

model, optimizer = model_and_optimizer("tiny")
read_checkpoint(written_on_tensorflow, "the JAX model", model=model, optimizer=optimizer)
np.savez(f"{work}/read_on_jax.npz", **values(model=model, optimizer=optimizer))
"""


@pytest.fixture(scope="module")
def across_backends(tmp_path_factory):
    """A tiny model's checkpoint written on TensorFlow and the values it holds; the child's run
    on JAX over it. (work folder, TensorFlow's values, the child's checkpoint path)."""
    work = tmp_path_factory.mktemp("across_backends")
    keras.utils.set_random_seed(3)
    model, optimizer = model_and_optimizer("tiny")
    take_a_step(model, optimizer, seed=2)
    written = tf.train.Checkpoint(model=model, optimizer=optimizer).save(
        str(work / "written_on_tensorflow" / "ckpt"))
    want = values(model=model, optimizer=optimizer)
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": JAX_XLA_FLAGS}
    done = subprocess.run([sys.executable, "-c", ON_JAX, TESTS, str(work), written], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return work, want, done.stdout.splitlines()[-1]


@pytest.mark.large
@pytest.mark.subprocess
def test_a_checkpoint_written_on_jax_restores_on_tensorflow(across_backends):
    """The weights through `restore_weights` (as tfxl-eval and tfxl-export read them); the whole
    of it, optimizer included, through `tf.train.Checkpoint` (as the trainer resumes), with
    every object matched; JAX's int32 step count read as TensorFlow's int64."""
    work, _, written = across_backends
    saved = dict(np.load(work / "saved_on_jax.npz"))
    model, optimizer = model_and_optimizer("tiny")
    restore_weights(model, written)
    assert_same_values(values(model=model), {p: v for p, v in saved.items()
                                             if p.startswith("model/")})
    tf.train.Checkpoint(model=model, optimizer=optimizer).restore(
        written).assert_existing_objects_matched()
    assert optimizer.iterations.dtype == "int64" and int(optimizer.iterations.numpy()) == 1
    assert_same_values(values(model=model, optimizer=optimizer), saved)


@pytest.mark.large
@pytest.mark.subprocess
def test_a_checkpoint_written_on_tensorflow_reads_on_jax(across_backends):
    work, want, _ = across_backends
    assert_same_values(dict(np.load(work / "read_on_jax.npz")), want)


# -- a checkpoint that does not fit ---------------------------------------------------------------

@pytest.mark.parametrize("other,message", [
    (dict(n_layer=1), "it has no model/backbone/block_1/attention/query_kernel"),
    (dict(d_inner=32), "model/backbone/block_0/feed_forward/inner/_kernel is [16, 32] there, "
                       "[16, 24] here"),
], ids=["a variable missing", "another shape"])
def test_a_checkpoint_that_does_not_fit_is_named_and_nothing_is_read(tmp_path, other, message):
    """The first variable the checkpoint lacks, or holds in another shape, is named; the
    variables before it, which fit, keep their values."""
    path = tf.train.Checkpoint(model=factories.tiny_lm(**other)).save(str(tmp_path / "ckpt"))
    model = factories.tiny_lm()
    before = values(model=model)
    with pytest.raises(ValueError) as raised:
        read_checkpoint(path, "the tiny model", model=model)
    assert str(raised.value) == f"checkpoint {path} does not fit the tiny model: {message}"
    assert_same_values(values(model=model), before)


def test_a_checkpoint_without_an_object_graph_has_no_paths(tmp_path):
    """A checkpoint of names only (TensorFlow 1's) holds no path: nothing of a model fits."""
    prefix = str(tmp_path / "names_only")
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=["model/kernel"], shape_and_slices=[""],
                      tensors=[tf.zeros([2])])
    reader, keys = checkpoint_paths(prefix)
    assert keys == {} and reader.has_tensor("model/kernel")
    assert checkpoint_shapes(prefix, "model") == {}
    with pytest.raises(ValueError, match=r"does not fit the tiny model: it has no model/"):
        read_checkpoint(prefix, "the tiny model", model=factories.tiny_lm())


@pytest.mark.parametrize("arrays,message", [
    ({"memory/states": (2, 3)}, "memory/states is [2, 3] there, [4, 3] here"),
    ({"memory/valid": (2,)}, "it has no memory/valid"),
], ids=["another shape", "missing"])
def test_arrays_read_beside_the_variables_are_checked_before_anything_is_assigned(
        tmp_path, arrays, message):
    """A training memory read with the weights (`arrays`): its values come back when they fit;
    one that does not is named, and no weight is assigned."""
    states = tf.Variable(tf.reshape(tf.range(6, dtype=tf.float32), (2, 3)))
    source = factories.tiny_lm()
    path = tf.train.Checkpoint(model=source, memory=tf.train.Checkpoint(states=states)).save(
        str(tmp_path / "ckpt"))
    model = factories.tiny_lm()
    read = read_checkpoint(path, "the run", arrays={"memory/states": (2, 3)}, model=model)
    np.testing.assert_array_equal(read["memory/states"], states.numpy())
    assert_same_values(values(model=model), values(model=source))
    model = factories.tiny_lm()
    before = values(model=model)
    wanted = {name: (4, 3) if name == "memory/states" else shape
              for name, shape in arrays.items()}
    with pytest.raises(ValueError) as raised:
        read_checkpoint(path, "the run", arrays=wanted, model=model)
    assert str(raised.value) == f"checkpoint {path} does not fit the run: {message}"
    assert_same_values(values(model=model), before)
