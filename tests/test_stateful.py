"""StatefulTransfoXLLM under Keras' own fit/evaluate/predict on every backend: the memory carried
across batches (and fit calls), evaluate's and predict's own memory, resets, `.keras` files.

Each check compares with the stateless `TransfoXLLM` called by hand on the same weights
(the layer-input path), so the trainers' state handling (TensorFlow's variables, JAX's
StatelessScope and donated buffers, PyTorch's eager steps) is what is tested.
"""

import keras
import numpy as np
import pytest

from backends import to_numpy
from factories import tiny_config
from tfxl import StatefulTransfoXLLM

pytestmark = pytest.mark.every_backend

B, T, V = 2, 4, 16


def batches(n, seed=0):
    """n consecutive [B, T] segments of B random streams: (x [n * B, T], y [n * B, T]), rows in
    the order Keras cuts arrays into batches of B."""
    stream = np.random.default_rng(seed).integers(0, V, (B, n * T + 1)).astype(np.int32)
    x = np.concatenate([stream[:, i * T:(i + 1) * T] for i in range(n)])
    y = np.concatenate([stream[:, i * T + 1:(i + 1) * T + 1] for i in range(n)])
    return x, y


def by_hand(lm, x, y=None, memory=None, resets=None):
    """Per-batch mean NLL (or log-probs without y) of consecutive batches of x, and the memory
    after them: the stateless model on the layer-input memory."""
    memory = lm.init_memory(B) if memory is None else memory
    out = []
    for i in range(len(x) // B):
        rows = slice(i * B, (i + 1) * B)
        reset = None if resets is None else resets[rows]
        result, memory = lm(x[rows], memory, reset=reset,
                            targets=None if y is None else y[rows])
        out.append(to_numpy(result).mean() if y is not None else to_numpy(result))
    return (np.array(out) if y is not None else np.concatenate(out)), memory


@pytest.fixture(scope="module")
def fitted():
    """A model fit (learning rate 0: the weights stay, so every batch's loss has a hand value)
    on 3 batches, with each batch's running mean loss recorded; then one Adam step on a 4th
    batch in a second fit call. (model, x, y, running means, weights and memory before the
    second fit, its loss)."""
    x, y = batches(4)
    model = StatefulTransfoXLLM(tiny_config(vocab_size=V), batch_size=B)
    model.compile(keras.optimizers.SGD(0.0))
    running = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: running.append(logs["loss"]))
    model.fit(x[:3 * B], y[:3 * B], epochs=1, verbose=0, callbacks=[record])
    # Copies: a variable's value is the variable's own buffer on TensorFlow and PyTorch
    # (later steps write it), and JAX's next fit donates it.
    weights = model.get_weights()
    memory = type(model._memory.variables)(*keras.tree.map_structure(to_numpy,
                                                                      model._memory.read()))
    model.compile(keras.optimizers.Adam(1e-2))
    second = model.fit(x[3 * B:], y[3 * B:], verbose=0).history["loss"][0]
    return model, x, y, running, weights, memory, second


def test_fit_carries_the_memory_across_batches_and_fit_calls(fitted):
    model, x, y, running, weights, memory, second = fitted
    # The running mean of k equal-sized batches gives each batch's loss.
    k = np.arange(1, 4)
    per_batch = k * np.array(running) - np.concatenate([[0.0], (k * np.array(running))[:-1]])
    lm = StatefulTransfoXLLM(model.config, batch_size=B).lm
    lm.set_weights(weights)
    want, after = by_hand(lm, x[:3 * B], y[:3 * B])
    np.testing.assert_allclose(per_batch, want, atol=2e-5)
    np.testing.assert_allclose(memory.states, to_numpy(after.states), atol=1e-5)
    assert memory.valid.all()
    # The second fit call continues the memory, at the weights the first one left.
    want_second, _ = by_hand(lm, x[3 * B:], y[3 * B:], memory=after)
    np.testing.assert_allclose(second, want_second[0], atol=1e-5)
    assert not np.allclose(model.get_weights()[0], weights[0])  # Adam stepped


def test_evaluate_and_predict_carry_their_own_memory(fitted):
    model, x, y, *_ = fitted
    trained = to_numpy(model._memory.variables.states)
    # evaluate(): the mean of its batches' losses, from an empty memory, on the key/value path.
    want, _ = by_hand(model.lm, x, y)
    assert model.evaluate(x, y, verbose=0) == pytest.approx(want.mean(), abs=1e-5)
    np.testing.assert_array_equal(to_numpy(model._memory.variables.states), trained)
    log_probs, _ = by_hand(model.lm, x)
    np.testing.assert_allclose(model.predict(x, verbose=0), log_probs, atol=2e-5)
    # predict_on_batch and test_on_batch continue the key/value memory that predict left.
    model.predict(x[:2 * B], verbose=0)
    np.testing.assert_allclose(to_numpy(model.predict_on_batch(x[2 * B:3 * B])),
                               log_probs[2 * B:3 * B], atol=2e-5)
    assert model.test_on_batch(x[3 * B:], y[3 * B:]) == pytest.approx(want[3], abs=1e-5)


def test_reset_clears_rows_and_reset_memory_clears_all(fitted):
    model, x, y, *_ = fitted
    resets = np.zeros(len(x), bool)
    resets[B + 1] = True  # stream 1 starts again at batch 2
    model.reset_memory()
    assert not to_numpy(model._memory.valid).any()
    model.compile(keras.optimizers.SGD(0.0))
    got = model.evaluate({"inputs": x, "reset": resets}, y, verbose=0)
    want, _ = by_hand(model.lm, x, y, resets=resets)
    assert got == pytest.approx(want.mean(), abs=1e-5)
    model.fit({"inputs": x[:2 * B], "reset": resets[:2 * B]}, y[:2 * B], verbose=0)
    _, after = by_hand(model.lm, x[:2 * B], y[:2 * B], resets=resets[:2 * B])
    np.testing.assert_allclose(to_numpy(model._memory.variables.states),
                               to_numpy(after.states), atol=1e-5)


def test_a_keras_file_holds_the_weights_and_no_memory(fitted, tmp_path):
    model, x, *_ = fitted
    assert len(model.weights) == len(model.lm.weights)
    assert len(model.non_trainable_variables) > len(model.non_trainable_weights)  # the state
    path = str(tmp_path / "stateful.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, StatefulTransfoXLLM) and loaded.batch_size == B
    assert not to_numpy(loaded._memory.valid).any()
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0),
                               atol=1e-5)
