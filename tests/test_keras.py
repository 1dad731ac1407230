"""Keras composition: the backbone in a functional model (every backend), the LM under plain
model.fit on tf.data (TensorFlow; tests/test_stateful.py runs the stateful model everywhere)."""

import keras
import numpy as np
import pytest

import factories
from factories import tiny_config
from tfxl import StatefulTransfoXLLM, TransfoXLBackbone
from tfxl.layers.memory import KeyValueMemory

pytestmark = pytest.mark.every_backend

T, B = 8, 4


def config(**kw):
    return tiny_config(**{**dict(vocab_size=16, n_layer=1, d_model=32, d_head=16, d_inner=64,
                                 tgt_len=T, mem_len=T, init_std=0.05), **kw})


def test_backbone_in_a_functional_classifier_trains_with_fit():
    # Label: does token 3 occur in the sequence?
    rng = np.random.default_rng(0)
    x = rng.integers(4, 16, (256, T)).astype(np.int32)
    y = rng.integers(0, 2, 256).astype(np.int32)
    x[y == 1, rng.integers(0, T, int(y.sum()))] = 3
    ids = keras.Input((T,), dtype="int32")
    hidden, _ = TransfoXLBackbone(config(), name="backbone")(ids)
    logits = keras.layers.Dense(2)(keras.layers.GlobalMaxPooling1D()(hidden))
    classifier = keras.Model(ids, logits)
    classifier.compile(keras.optimizers.Adam(3e-3),
                       keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                       metrics=["accuracy"])
    history = classifier.fit(x, y, batch_size=32, epochs=8, verbose=0)
    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]
    assert history.history["accuracy"][-1] > 0.9


def stream_batches(n_batches, seed=0):
    """B streams of repeated random blocks, cut into consecutive [B, T] segments."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 16, (B, n_batches, T))
    stream = np.repeat(blocks, 2, axis=1).reshape(B, -1)[:, :n_batches * T + 1]
    x = np.stack([stream[:, i * T:(i + 1) * T] for i in range(n_batches)]).astype(np.int32)
    y = np.stack([stream[:, i * T + 1:(i + 1) * T + 1] for i in range(n_batches)]).astype(np.int32)
    return x, y


def as_dataset(x, y):
    import tensorflow as tf
    return tf.data.Dataset.from_tensor_slices((x, y))  # one [B, T] batch per element, in order


@pytest.mark.large
@pytest.mark.tensorflow_only
def test_stateful_fit_carries_memory_and_matches_the_stateless_model(tmp_path):
    x, y = stream_batches(60)
    model = StatefulTransfoXLLM(config(), batch_size=B)
    model.compile(keras.optimizers.Adam(3e-3))
    history = model.fit(as_dataset(x, y), epochs=3, verbose=0, shuffle=False)
    assert history.history["loss"][-1] < history.history["loss"][0] - 0.3
    assert model._memory.valid.numpy().all()

    # evaluate() carries its own (key/value) memory batch to batch exactly like the stateless
    # model does by hand on the layer-input path, starting empty, and leaves the training memory
    # alone.
    trained_memory = model._memory.variables.states.numpy()
    got = model.evaluate(as_dataset(x[:10], y[:10]), verbose=0)
    memory, total = model.lm.init_memory(B), 0.0
    for xb, yb in zip(x[:10], y[:10]):
        nll, memory = model.lm(xb, memory, targets=yb)
        total += float(np.mean(nll.numpy()))
    np.testing.assert_allclose(got, total / 10, rtol=1e-5)
    np.testing.assert_array_equal(model._memory.variables.states.numpy(), trained_memory)

    # The .keras file holds the weights, not the memory.
    path = str(tmp_path / "stateful.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, StatefulTransfoXLLM) and loaded.batch_size == B
    assert len(loaded.weights) == len(model.lm.weights)
    assert not loaded._memory.valid.numpy().any()
    np.testing.assert_allclose(loaded.predict(x[0], batch_size=B, verbose=0),
                               model.predict(x[0], batch_size=B, verbose=0), atol=1e-5)


def log_probs_by_hand(lm, segments):
    """Log-probs of consecutive [B, T'] segments on the stateless layer-input path."""
    memory, out = lm.init_memory(B), []
    for ids in segments:
        log_probs, memory = lm(ids, memory)
        out.append(log_probs.numpy())
    return np.concatenate(out)


@pytest.mark.tensorflow_only
def test_stateful_predict_uses_a_key_value_memory_equal_to_the_layer_input_path():
    x, _ = stream_batches(6, seed=1)
    # mem_len > T, and an init_std at which attention is neither uniform nor one-hot.
    model = StatefulTransfoXLLM(config(mem_len=2 * T, init_std=0.1), batch_size=B)
    model.compile(keras.optimizers.Adam(3e-3))
    assert model.built  # on construction: every weight shape comes from the config

    def predict(segments):
        return model.predict(factories.slices(segments), verbose=0)

    np.testing.assert_allclose(predict(x), log_probs_by_hand(model.lm, x), atol=2e-5)
    assert isinstance(model._eval_memory.variables, KeyValueMemory)
    assert model._eval_memory.valid.numpy().all()
    # Other weights (as after fit): the next predict() recomputes its cached position keys.
    for variable in model.lm.trainable_variables:
        variable.assign(variable * 1.5)
    np.testing.assert_allclose(predict(x), log_probs_by_hand(model.lm, x), atol=2e-5)
    # Segments shorter than tgt_len compute their position keys in the step.
    halves = x[:, :, :T // 2]
    np.testing.assert_allclose(predict(halves), log_probs_by_hand(model.lm, halves), atol=2e-5)
    # predict_on_batch continues the memory, with position keys for the current weights (here
    # set after build, which computed the first ones).
    fresh = StatefulTransfoXLLM(model.config, batch_size=B)
    fresh.build()
    fresh.set_weights(model.get_weights())
    got = [fresh.predict_on_batch(ids) for ids in x[:3]]
    np.testing.assert_allclose(np.concatenate(got), log_probs_by_hand(model.lm, x[:3]),
                               atol=2e-5)

