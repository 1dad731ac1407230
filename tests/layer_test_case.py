"""`run_layer_test`: the checks every Keras layer of tfxl passes, in the manner of keras-hub's
`TestCase.run_layer_test`. Numerics against the naive oracle stay in each layer's own tests; this
checks the Keras contract: configs, symbolic calls, `.keras` files, XLA and mixed precision.
"""

import os
import tempfile

import keras
import numpy as np
from keras import tree

from backends import compiled, to_numpy


def _shapes(structure):
    return tree.map_structure(lambda x: tuple(x.shape), structure)


def _assert_all_close(got, want, atol, rtol, what, atol_of_scale=0.0):
    """Leaf by leaf (a loaded model returns lists where the layer returned tuples); the absolute
    tolerance of each leaf is atol + atol_of_scale * max|want|."""
    got, want = tree.flatten(got), tree.flatten(want)
    assert len(got) == len(want), f"{what}: {len(got)} outputs, expected {len(want)}"
    for i, (a, b) in enumerate(zip(got, want)):
        a, b = to_numpy(a).astype(np.float64), to_numpy(b).astype(np.float64)
        assert a.shape == b.shape, f"{what}, output {i}: shape {a.shape} != {b.shape}"
        tolerance = atol + atol_of_scale * (np.abs(b).max() if b.size else 0.0)
        np.testing.assert_allclose(a, b, atol=tolerance, rtol=rtol, err_msg=f"{what}, output {i}")


def run_layer_test(layer_cls, init_kwargs, input_data=(), call_kwargs=None,
                   expected_output_shape=None, package="tfxl", mixed_precision_tolerance=1e-2):
    """Builds `layer_cls(**init_kwargs)`, calls it on `input_data` and checks:

    - the class is registered as "{package}>{name}", its config holds the init arguments, and
      get_config/from_config and Keras (de)serialisation give back the same config;
    - output shapes (a structure like the outputs) equal `expected_output_shape` when given;
    - a symbolic call on `keras.Input`s (a functional model) gives the eager outputs' structure,
      shapes and dtypes, and the model computes the eager outputs;
    - that model saved to a `.keras` file and loaded back gives identical outputs;
    - a compiled call (`backends.compiled`: XLA on TensorFlow and JAX) equals the eager call;
    - the layer under the mixed_bfloat16 policy, with the same weights, keeps float32 variables
      and gives finite outputs within `mixed_precision_tolerance` of float32 (relative to each
      output's largest magnitude).

    input_data: the positional call arguments, each an array or a structure (tuple, list) of
    arrays (None leaves stay None); call_kwargs: the other call arguments (Python values, not
    tensors). A layer called with no tensor (the position encoding) has no functional model: its
    symbolic check is `compute_output_shape(**call_kwargs)` and it has no weights for a `.keras`
    file to hold.
    Returns the float32 layer and its eager outputs.
    """
    call_kwargs = dict(call_kwargs or {})
    args = tree.map_structure(lambda x: None if x is None else keras.ops.convert_to_tensor(x),
                              tuple(input_data))
    name = layer_cls.__name__

    assert keras.saving.get_registered_object(f"{package}>{name}") is layer_cls, \
        f"{name} is not registered as {package}>{name}"
    layer = layer_cls(**init_kwargs)
    config = layer.get_config()
    for key, value in init_kwargs.items():  # the config states what the layer was built with
        assert key in config, f"{name}.get_config() lacks {key!r}"
        if isinstance(value, (bool, int, float, str, tuple)):
            got = tuple(config[key]) if isinstance(value, tuple) else config[key]
            assert got == value, f"{name}.get_config()[{key!r}] = {config[key]!r}, built {value!r}"
    assert layer_cls.from_config(config).get_config() == config
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(clone) is layer_cls and clone.get_config() == config

    outputs = layer(*args, **call_kwargs)
    if expected_output_shape is not None:
        assert _shapes(outputs) == expected_output_shape, \
            f"{name}: output shapes {_shapes(outputs)}, expected {expected_output_shape}"

    if any(x is not None for x in tree.flatten(args)):
        _check_symbolic_call_and_keras_file(layer, args, call_kwargs, outputs)
    else:
        assert tuple(layer.compute_output_shape(**call_kwargs)) == _shapes(outputs), \
            f"{name}: compute_output_shape disagrees with the call"

    _assert_all_close(compiled(lambda *a: layer(*a, **call_kwargs))(*args), outputs, 1e-5, 1e-5,
                      f"{name} compiled")

    mixed = layer_cls.from_config({**config, "dtype": "mixed_bfloat16"})
    mixed(*args, **call_kwargs)  # builds it
    mixed.set_weights(layer.get_weights())
    mixed_outputs = mixed(*args, **call_kwargs)
    assert mixed.compute_dtype == "bfloat16"
    assert all(v.dtype == "float32" for v in mixed.trainable_weights), \
        f"{name}: mixed precision must keep float32 variables"
    for out in tree.flatten(mixed_outputs):
        assert np.isfinite(to_numpy(out).astype(np.float64)).all(), \
            f"{name}: non-finite in bfloat16"
    # bfloat16 keeps 8 significant bits: errors scale with the outputs' magnitude.
    _assert_all_close(mixed_outputs, outputs, 0.0, mixed_precision_tolerance,
                      f"{name} under mixed_bfloat16", atol_of_scale=mixed_precision_tolerance)
    return layer, outputs


def _check_symbolic_call_and_keras_file(layer, args, call_kwargs, outputs):
    name = type(layer).__name__
    leaves = tree.flatten(args)
    inputs = [None if x is None else keras.Input(batch_shape=tuple(x.shape),
                                                 dtype=keras.backend.standardize_dtype(x.dtype))
              for x in leaves]
    symbolic = layer(*tree.pack_sequence_as(args, inputs), **call_kwargs)
    inputs = [x for x in inputs if x is not None]
    flat_args = [x for x in leaves if x is not None]
    tree.assert_same_structure(symbolic, outputs)
    assert _shapes(symbolic) == _shapes(outputs), f"{name}: symbolic shapes differ from eager"
    dtype = keras.backend.standardize_dtype
    for s, e in zip(tree.flatten(symbolic), tree.flatten(outputs)):
        assert dtype(s.dtype) == dtype(e.dtype), f"{name}: symbolic {s.dtype}, eager {e.dtype}"
    model = keras.Model(inputs, symbolic)
    want = model(flat_args)
    _assert_all_close(want, outputs, 0, 0, f"{name} in a functional model")
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "layer.keras")
        model.save(path)
        loaded = keras.saving.load_model(path)
    assert any(type(sub) is type(layer) and sub.get_config() == layer.get_config()
               for sub in loaded.layers), f"{name}: not in the loaded model"
    _assert_all_close(loaded(flat_args), want, 0, 0, f"{name} after a .keras round trip")
