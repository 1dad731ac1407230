"""The memory types: the protocol each implements, what tf.nest, keras.tree and tf.function take,
the dict boundary, the model's entry check and the holder of memory carried across calls; on
every backend (tf.nest and tf.function on TensorFlow)."""

import inspect

import keras
import numpy as np
import pytest

from backends import BACKEND, to_numpy
from factories import tiny_lm
from tfxl.layers.memory import (LAYER_VIEW_TYPES, MEMORY_TYPES, KeyValueMemory, LayerInputMemory,
                                LayerView, Memory, PositionCache, RecentWindowMemory,
                                as_memory)
from tfxl.models.memory_variables import MemoryVariables

pytestmark = pytest.mark.every_backend

B, T, M = 2, 4, 6


@pytest.fixture(scope="module")
def lm():
    return tiny_lm(mem_len=M)


def members(protocol):
    return sorted(name for name in vars(protocol) if not name.startswith("_"))


@pytest.mark.parametrize("cls", MEMORY_TYPES + LAYER_VIEW_TYPES, ids=lambda cls: cls.__name__)
def test_every_memory_type_and_view_implements_its_protocol_itself(cls):
    """Each member of `Memory` (a memory type) or `LayerView` (a view) is defined on the class
    itself, with the protocol's parameters: a NamedTuple inherits nothing, so a member missing
    here is missing."""
    protocol = Memory if cls in MEMORY_TYPES else LayerView
    assert members(protocol)
    for name in members(protocol):
        assert name in vars(cls), f"{cls.__name__} lacks {protocol.__name__}.{name}"
        want, got = vars(protocol)[name], vars(cls)[name]
        if inspect.isfunction(want):
            assert (list(inspect.signature(got).parameters)
                    == list(inspect.signature(want).parameters)), f"{cls.__name__}.{name}"
        else:
            assert isinstance(got, property), f"{cls.__name__}.{name}"


def test_each_memory_type_gives_a_view_of_its_own(lm):
    c = lm.config
    memories = [lm.init_memory(B), lm.init_key_value_memory(B, mem_len=M),
                lm.init_key_value_ring(B, T, M), RecentWindowMemory.from_memory(
                    lm.init_key_value_memory(B, mem_len=M), 3),
                PositionCache.empty(B, c.n_layer, 8, c.n_head, c.d_head)]
    assert {type(m) for m in memories} == set(MEMORY_TYPES)
    for memory in memories:
        assert isinstance(memory, Memory) and isinstance(memory.layer(0), LayerView)
        assert type(memory.layer(0)) in LAYER_VIEW_TYPES


def test_a_position_cache_marks_no_slot_invalid(lm):
    c = lm.config
    cache = PositionCache.empty(B, c.n_layer, 8, c.n_head, c.d_head)
    hidden, cache = lm.backbone(np.ones((B, 1), "int32"), cache)
    assert int(to_numpy(cache.position)) == 1
    with pytest.raises(ValueError, match="a PositionCache marks no slot invalid"):
        lm.backbone(np.ones((B, 1), "int32"), cache, reset=np.array([True, False]))
    with pytest.raises(ValueError, match="a PositionCache reads one token per call; got 2"):
        lm.backbone(np.ones((B, 2), "int32"), cache)


def test_both_types_flatten_and_pack_back_with_tf_nest_and_keras_tree(lm):
    nests = [keras.tree]
    if BACKEND == "tensorflow":
        import tensorflow as tf
        nests.append(tf.nest)
    for memory in (lm.init_memory(B), lm.init_key_value_memory(B, mem_len=M)):
        n_tensors = 2 if isinstance(memory, LayerInputMemory) else 2 * lm.config.n_layer + 1
        for nest in nests:
            leaves = nest.flatten(memory)
            assert len(leaves) == n_tensors
            packed = nest.pack_sequence_as(memory, leaves)
            assert type(packed) is type(memory)


@pytest.mark.tensorflow_only
def test_a_key_value_memory_goes_through_a_tf_function_signature_and_a_while_loop(lm):
    import tensorflow as tf
    ids = np.random.default_rng(0).integers(0, 23, (B, T)).astype("int32")
    memory = lm.init_key_value_memory(B, mem_len=M)
    spec = tf.nest.map_structure(tf.TensorSpec.from_tensor, memory)

    @tf.function(input_signature=[tf.TensorSpec([B, T], tf.int32), spec])
    def three_segments(ids, memory):
        def body(step, memory):
            return step + 1, lm(ids, memory)[1]
        return tf.while_loop(lambda step, _: step < 3, body, (tf.constant(0), memory))[1]

    got = three_segments(ids, memory)
    assert isinstance(got, KeyValueMemory)
    want = memory
    for _ in range(3):
        want = lm(ids, want)[1]
    for name, tensor in got.to_dict().items():
        np.testing.assert_allclose(to_numpy(tensor), to_numpy(want.to_dict()[name]), atol=1e-5)


def test_to_dict_and_as_memory_are_the_signatures_form_and_round_trip(lm):
    key_value = lm.key_value_memory(lm(np.ones((B, T), "int32"), lm.init_memory(B))[1])
    wire = key_value.to_dict()
    c = lm.config
    assert wire["keys"].shape == (B, c.n_layer, c.n_head, c.d_head, M)
    assert wire["values"].shape == (B, c.n_layer, c.n_head, M, c.d_head)
    back = as_memory(wire)
    assert isinstance(back, KeyValueMemory) and len(back.keys) == c.n_layer
    for got, want in zip(keras.tree.flatten(back), keras.tree.flatten(key_value)):
        np.testing.assert_array_equal(to_numpy(got), to_numpy(want))
    states = lm.init_memory(B)
    assert isinstance(as_memory(states.to_dict()), LayerInputMemory)
    with pytest.raises(ValueError, match=r"a memory dict has the keys \['keys', 'valid'\]"):
        as_memory({"keys": wire["keys"], "valid": wire["valid"]})


def test_the_model_refuses_a_dict_naming_as_memory_and_takes_a_list_of_fields(lm):
    ids = np.ones((B, T), "int32")
    memory = lm.init_memory(B)
    with pytest.raises(TypeError, match="got dict .*tfxl.layers.memory.as_memory"):
        lm(ids, memory.to_dict())
    # What Keras' functional models rebuild a NamedTuple input as.
    want, _ = lm(ids, memory)
    got, new_memory = lm(ids, list(memory))
    assert isinstance(new_memory, LayerInputMemory)
    np.testing.assert_array_equal(to_numpy(got), to_numpy(want))


def test_memory_variables_hold_read_write_and_clear_a_memory(lm):
    held = MemoryVariables(lm.init_key_value_memory(B, mem_len=M), "held")
    assert isinstance(held.variables, KeyValueMemory)
    assert all(not v.trainable for v in keras.tree.flatten(held.variables))
    _, memory = lm(np.ones((B, T), "int32"), held.read())
    held.write(memory)
    np.testing.assert_array_equal(to_numpy(held.read().valid), to_numpy(memory.valid))
    np.testing.assert_array_equal(to_numpy(held.read().keys[0]), to_numpy(memory.keys[0]))
    assert to_numpy(held.read().valid).any()
    held.clear()
    assert not to_numpy(held.read().valid).any()
