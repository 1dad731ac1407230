"""What a Keras user meets first: batch size and stream order at every entry of the stateful
model, compiled metrics (tfxl.metrics), Keras' warnings, the backbone in a Sequential,
summary() and default names of models never called (the README's snippets: test_readme.py)."""

import math
import re
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import factories
from factories import tiny_config
from tfxl.data.pipeline import InputParams, input_fn
from tfxl import (BitsPerCharacter, Perplexity, StatefulTransfoXLLM, TransfoXLBackbone,
                  TransfoXLLM)

B, T, V = 4, 4, 16


def stateful(**compile_kwargs):
    model = StatefulTransfoXLLM(tiny_config(vocab_size=V), batch_size=B)
    model.compile(keras.optimizers.Adam(1e-3), **compile_kwargs)
    return model


def token_rows(rows, seed=0):
    return np.random.default_rng(seed).integers(0, V, (rows, T)).astype(np.int32)


# -- batch size: every entry, eager and traced ----------------------------------------------
@pytest.mark.parametrize("run_eagerly,entry", [
    pytest.param(False, "fit", marks=pytest.mark.large), (False, "evaluate"), (False, "predict"),
    (True, "fit"), (True, "evaluate"), (True, "predict")])
def test_stateful_refuses_a_batch_of_another_size_with_its_own_message(entry, run_eagerly):
    model = stateful(run_eagerly=run_eagerly)
    x = token_rows(2 * B - 1)
    # Batches of B rows, then one of B - 1: the traced step sees [None, T], not the size.
    data = factories.slices((x, x)).batch(B)
    run = getattr(model, entry)
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)) as error:
        run(data.map(lambda x, y: x) if entry == "predict" else data, verbose=0)
    message = str(error.value)
    assert f"built for batch_size={B} streams" in message
    assert "ConcatV2" not in message and "gradient_tape" not in message


def test_stateful_call_and_array_input_refuse_another_batch_size_before_any_step():
    model = stateful()
    with pytest.raises(ValueError, match=f"built for batch_size={B} streams, got a batch of 3"):
        model(token_rows(3))
    x = token_rows(2 * B)
    with pytest.raises(ValueError, match=f"fit: batch_size=3, but the model was built for "
                                         f"batch_size={B}"):
        model.fit(x, x, batch_size=3, verbose=0)
    with pytest.raises(ValueError, match=f"evaluate: x has {2 * B - 1} rows, not a multiple"):
        model.evaluate(x[:-1], x[:-1], verbose=0)
    with pytest.raises(ValueError, match=f"fit \\(validation_data\\): x has {2 * B - 1} rows"):
        model.fit(x, x, validation_data=(x[:-1], x[:-1]), verbose=0)
    assert model.optimizer.iterations.numpy() == 0  # refused before any step


# -- stream order -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fit_on_arrays():
    """A stateful model with tfxl's metrics compiled, fit on arrays for 2 epochs: (the model,
    its weights before and after the fit, x, y, the fit's history). The stream-order and the
    metrics tests both read this one fit (one traced train step, not two); metrics leave the
    weights alone."""
    x, y = token_rows(6 * B, seed=1), token_rows(6 * B, seed=2)
    model = stateful(metrics=[BitsPerCharacter(), Perplexity()])
    initial = model.get_weights()
    history = model.fit(x, y, epochs=2, verbose=0).history  # Keras' default would shuffle rows
    return model, (initial, model.get_weights()), x, y, history


@pytest.mark.large
def test_stateful_fit_on_arrays_keeps_stream_order_and_refuses_shuffle(fit_on_arrays):
    on_arrays, (initial, fitted), x, y, _ = fit_on_arrays
    on_batches = stateful()
    on_batches.set_weights(initial)
    batches = factories.slices((x, y)).batch(B)
    on_batches.fit(batches, epochs=2, verbose=0)
    for got, want in zip(fitted, on_batches.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-6)
    with pytest.raises(ValueError, match="shuffle=True would break stream order"):
        on_arrays.fit(x, y, shuffle=True, verbose=0)


def small_bytes_data(root):
    """A data dir like factories.random_bytes_data's (random bytes of "abcdefgh", T-token
    segments, B streams) with 4,000 training bytes and 400 (not 2,000) in valid and test: each
    evaluation pass reads its whole finite split, 25 batches rather than 125, and Keras runs
    each step from Python."""
    from tfxl.data.prepare import PrepareConfig, prepare
    rng = np.random.default_rng(0)
    for split, size in (("train", 4000), ("valid", 400), ("test", 400)):
        (root / f"{split}.txt").write_bytes(rng.choice(np.frombuffer(b"abcdefgh", np.uint8),
                                                       size).tobytes())
    prepare(PrepareConfig(output_dir=str(root / "data"), train=[str(root / "train.txt")],
                          valid=[str(root / "valid.txt")], test=[str(root / "test.txt")],
                          tokenizer="bytes", tgt_len=T, num_streams=B), log=lambda *a: None)
    return str(root / "data")


@pytest.mark.large
def test_correct_tf_data_input_gets_no_keras_warning(tmp_path):
    """input_fn's training stream is endless (steps_per_epoch), its evaluation splits finite:
    Keras read their unknown length as "input ran out of data", and fit's default shuffle=True
    as "shuffle=True ... ignored"."""
    data_dir = small_bytes_data(tmp_path)

    def batches(split, training):
        params = InputParams(data_dir=data_dir, batch_size=B, training=training)
        return input_fn(split, params).map(
            lambda b: ({"inputs": b["inputs"], "reset": b["reset"] > 0}, b["targets"],
                       b["target_mask"]))

    model = StatefulTransfoXLLM(tiny_config(vocab_size=258), batch_size=B)
    model.compile(keras.optimizers.Adam(1e-3), metrics=[BitsPerCharacter()])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(batches("train", True), steps_per_epoch=5, epochs=2, verbose=0,
                  validation_data=batches("valid", False))
        model.evaluate(batches("test", False), verbose=0)
    assert [str(w.message) for w in caught] == []


# -- metrics ----------------------------------------------------------------------------------
def test_bpc_and_perplexity_metrics_equal_a_hand_computation():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 2, 3, V))
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    ids = rng.integers(0, V, (2, 2, 3))
    mask = np.array([[[1, 1, 0], [1, 1, 1]], [[0, 1, 1], [1, 0, 1]]], np.float32)
    nll = -np.take_along_axis(log_probs, ids[..., None], -1)[..., 0]
    mean = (nll * mask).sum() / mask.sum()  # every counted token once, over both batches
    for metric, want in ((BitsPerCharacter(), mean / math.log(2)), (Perplexity(), math.exp(mean))):
        for as_log_probs in (False, True):
            metric.reset_state()
            for b in range(2):  # two batches: the state accumulates tokens, not batch means
                metric.update_state(ids[b], log_probs[b] if as_log_probs else nll[b],
                                    sample_weight=mask[b])
            assert float(metric.result()) == pytest.approx(want, rel=1e-6)
        again = keras.metrics.deserialize(keras.metrics.serialize(metric))
        assert type(again) is type(metric) and again.name == metric.name
        assert keras.saving.get_registered_name(type(metric)).startswith("tfxl>")


def test_stateful_fit_and_evaluate_report_compiled_metrics(fit_on_arrays):
    model, _, x, y, history = fit_on_arrays
    assert set(history) == {"loss", "bpc", "perplexity"}
    # Every batch counts B * T tokens, so the token mean equals the mean of batch losses.
    np.testing.assert_allclose(history["bpc"], np.array(history["loss"]) / math.log(2),
                               rtol=1e-5)
    got = model.evaluate(x, y, verbose=0, return_dict=True)
    assert got["bpc"] == pytest.approx(got["loss"] / math.log(2), rel=1e-5)
    assert got["perplexity"] == pytest.approx(math.exp(got["loss"]), rel=1e-5)


# -- the backbone in a Sequential -------------------------------------------------------------
def test_backbone_without_memory_output_goes_in_a_sequential_and_round_trips(tmp_path):
    model = keras.Sequential([
        keras.Input((T,), dtype="int32"),
        TransfoXLBackbone(tiny_config(vocab_size=V), return_memory=False, name="backbone"),
        keras.layers.GlobalMaxPooling1D(), keras.layers.Dense(2)])
    x = token_rows(3)
    want = model.predict(x, verbose=0)
    assert want.shape == (3, 2)
    assert model.get_layer("backbone").get_config()["return_memory"] is False
    path = str(tmp_path / "sequential.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.get_layer("backbone").return_memory is False
    np.testing.assert_allclose(loaded.predict(x, verbose=0), want, atol=1e-6)


# -- summary and names of models never called -------------------------------------------------
@pytest.mark.parametrize("make", [lambda c: TransfoXLLM(c),
                                  lambda c: StatefulTransfoXLLM(c, batch_size=B)])
def test_a_model_never_called_summarises_its_weights_and_output_shapes(make):
    config = tiny_config(vocab_size=V)
    model = make(config)
    lines = []
    model.summary(print_fn=lambda line, **_: lines.append(line))
    text = "\n".join(lines)
    called = TransfoXLLM(config)
    called(token_rows(B))
    assert model.count_params() == called.count_params() > 0
    assert f"Total params: {called.count_params():,}" in text
    assert "?" not in text and "unbuilt" not in text
    assert f"(None, None, {V})" in text or f"({B}, None, {V})" in text


def test_default_names_spell_the_class_names():
    config = tiny_config()
    assert re.fullmatch(r"transfo_xl_lm(_\d+)?", TransfoXLLM(config).name)
    assert re.fullmatch(r"stateful_transfo_xl_lm(_\d+)?",
                        StatefulTransfoXLLM(config, batch_size=B).name)
    assert TransfoXLLM(config).name != TransfoXLLM(config).name  # unique, as Keras' own

