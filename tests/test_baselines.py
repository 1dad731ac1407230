"""The paper's baselines (tfxl/models/transformer_lm.py, tfxl/models/lstm_lm.py): the numpy
oracles, the LSTM's carried state against one full pass, the vanilla Transformer's sliding
window against a fresh pass per token, a context capped at tgt_len, `.keras` round trips, the
factory, the config's `architecture` and the sizes; on every backend."""

import json

import keras
import numpy as np
import pytest

from backends import compiled, to_numpy
from factories import tiny_config
from naive_reference import NaiveLSTM, NaiveTransformer, naive_lstm_step
from tfxl.analysis import context_losses, target_positions
from tfxl.config import TransfoXLConfig
from tfxl.layers.memory import RecurrentState, TokenWindow, as_memory
from tfxl.models import (LSTMLM, TransfoXLLM, TransformerLM, build_language_model,
                         language_model_class)
from tfxl.models.lstm_lm import lstm_step
from tfxl.models.memory_variables import MemoryVariables
from tfxl.models.scoring import score_document

pytestmark = pytest.mark.every_backend

W = 5  # the vanilla Transformer's tgt_len: its window
TOKENS = np.random.default_rng(7).integers(0, 23, size=(2, 17)).astype(np.int32)


def baseline(architecture, **overrides):
    return build_language_model(tiny_config(architecture=architecture, tgt_len=W, **overrides))


@pytest.fixture(scope="module")
def lstm():
    return baseline("lstm")


@pytest.fixture(scope="module")
def transformer():
    return baseline("transformer")


def nll_of(model, hidden, targets):
    """The model's own softmax on oracle hidden states (the head is tested on its own)."""
    return to_numpy(model.head(hidden.astype(np.float32), targets))


# -- the LSTM ---------------------------------------------------------------------------------

def test_the_lstm_step_is_the_numpy_oracles():
    rng = np.random.default_rng(0)
    x, h, c = rng.normal(size=(3, 6)), rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    w_x, w_h, b = rng.normal(size=(6, 16)), rng.normal(size=(4, 16)), rng.normal(size=16)
    tensor = lambda a: keras.ops.convert_to_tensor(a.astype(np.float32))
    got_h, got_c = lstm_step(tensor(x @ w_x + b), tensor(h), tensor(c), tensor(w_h))
    for row in range(3):
        want_h, want_c = naive_lstm_step(x[row], h[row], c[row], w_x, w_h, b)
        np.testing.assert_allclose(to_numpy(got_h)[row], want_h, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(to_numpy(got_c)[row], want_c, rtol=1e-5, atol=1e-5)


def test_the_lstm_model_is_the_numpy_oracle_and_carries_its_state(lstm):
    inputs, targets = TOKENS[:, :-1], TOKENS[:, 1:]
    hidden, state = NaiveLSTM(lstm).run(inputs)
    nll, memory = lstm(inputs, lstm.init_memory(2), targets=targets)
    np.testing.assert_allclose(to_numpy(nll), nll_of(lstm, hidden, targets), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(to_numpy(memory.hidden), np.stack(state[0], 1), atol=1e-5)
    np.testing.assert_allclose(to_numpy(memory.cell), np.stack(state[1], 1), atol=1e-5)
    assert to_numpy(memory.valid).all()


def test_the_lstm_read_segment_by_segment_on_its_state_is_one_full_pass(lstm):
    whole, _ = lstm(TOKENS[:, :-1], targets=TOKENS[:, 1:])
    memory, parts = lstm.init_memory(2), []
    step = compiled(lambda x, m, y: lstm(x, m, targets=y))
    for start in range(0, 16, 4):
        nll, memory = step(TOKENS[:, start:start + 4], memory, TOKENS[:, start + 1:start + 5])
        parts.append(to_numpy(nll))
    np.testing.assert_allclose(np.concatenate(parts, 1), to_numpy(whole), rtol=1e-5, atol=1e-5)


def test_a_reset_row_starts_its_lstm_state_afresh_and_padding_leaves_it(lstm):
    _, memory = lstm(TOKENS[:, :8], lstm.init_memory(2))
    nll, _ = lstm(TOKENS[:, 8:-1], memory, reset=np.array([True, False]),
                  targets=TOKENS[:, 9:])
    fresh, _ = lstm(TOKENS[:, 8:-1], targets=TOKENS[:, 9:])
    carried, _ = lstm(TOKENS[:, 8:-1], memory, targets=TOKENS[:, 9:])
    np.testing.assert_allclose(to_numpy(nll)[0], to_numpy(fresh)[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(to_numpy(nll)[1], to_numpy(carried)[1], rtol=1e-5, atol=1e-6)
    assert np.abs(to_numpy(carried)[0] - to_numpy(fresh)[0]).max() > 1e-4
    padded = np.concatenate([TOKENS[:, :4], np.zeros((2, 3), np.int32)], axis=1)
    valid = np.arange(7)[None, :].repeat(2, 0) < 4
    _, after_padding = lstm(padded, lstm.init_memory(2), segment_valid=valid)
    _, after_four = lstm(TOKENS[:, :4], lstm.init_memory(2))
    np.testing.assert_allclose(to_numpy(after_padding.hidden), to_numpy(after_four.hidden),
                               atol=1e-6)


# -- the vanilla Transformer -------------------------------------------------------------------

def test_the_transformer_is_the_numpy_oracle_on_a_training_segment(transformer):
    inputs, targets = TOKENS[:, :W], TOKENS[:, 1:W + 1]
    nll, memory = transformer(inputs, targets=targets)
    assert memory is None and transformer.init_memory(2) is None  # no memory in training
    oracle = NaiveTransformer(transformer)
    hidden = np.stack([oracle.window(row) for row in inputs])
    np.testing.assert_allclose(to_numpy(nll), nll_of(transformer, hidden, targets), rtol=1e-5,
                               atol=1e-5)


def test_the_sliding_window_scores_each_token_as_a_fresh_pass_over_its_window(transformer):
    """Evaluation in segments of 4 on the token window: token t is read with the W - 1 tokens
    before it (fewer at the start), as the oracle's fresh pass over tokens[t - W + 1 .. t]."""
    window, parts = transformer.init_key_value_ring(2, tgt_len=4, mem_len=99), []
    assert isinstance(window, TokenWindow) and window.mem_len == W - 1
    step = compiled(lambda x, m, y: transformer(x, m, targets=y))
    for start in range(0, 16, 4):
        nll, window = step(TOKENS[:, start:start + 4], window, TOKENS[:, start + 1:start + 5])
        parts.append(to_numpy(nll))
    got = np.concatenate(parts, 1)
    oracle = NaiveTransformer(transformer)
    hidden = np.stack([oracle.sliding(row, W) for row in TOKENS[:, :-1]])
    np.testing.assert_allclose(got, nll_of(transformer, hidden, TOKENS[:, 1:]), rtol=1e-5,
                               atol=1e-5)
    for t in range(16):  # the model itself, a fresh call on each window
        first = max(0, t - W + 1)
        fresh, _ = transformer(TOKENS[:, first:t + 1], targets=TOKENS[:, first + 1:t + 2])
        np.testing.assert_allclose(got[:, t], to_numpy(fresh)[:, -1], rtol=1e-5, atol=1e-5)


def test_a_reset_row_starts_its_window_afresh(transformer):
    _, window = transformer(TOKENS[:, :8], transformer.init_key_value_ring(2))
    nll, _ = transformer(TOKENS[:, 8:12], window, reset=np.array([True, False]),
                         targets=TOKENS[:, 9:13])
    fresh, _ = transformer(TOKENS[:, 8:12], targets=TOKENS[:, 9:13])
    carried, _ = transformer(TOKENS[:, 8:12], window, targets=TOKENS[:, 9:13])
    np.testing.assert_allclose(to_numpy(nll)[0], to_numpy(fresh)[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(to_numpy(nll)[1], to_numpy(carried)[1], rtol=1e-5, atol=1e-6)


def test_a_segment_longer_than_the_context_needs_the_window(transformer):
    with pytest.raises(ValueError, match="exceeds its context of tgt_len=5; pass "
                                         "init_key_value_ring"):
        transformer(TOKENS[:, :W + 1])


def test_the_vanillas_context_is_capped_at_tgt_len_and_the_lstms_is_not(transformer, lstm):
    """`context_losses`: the same loss at every context c >= tgt_len for the vanilla
    Transformer (its window), a loss that keeps changing for the LSTM (its state)."""
    tokens = np.random.default_rng(3).integers(0, 23, size=200)
    positions = target_positions(tokens.size, 6, 20, seed=2)
    contexts = [W, 10, 15, 20]
    capped = context_losses(transformer, tokens, positions, contexts, batch_size=6, tgt_len=4)
    for k in range(1, len(contexts)):
        np.testing.assert_allclose(capped[k], capped[0], rtol=1e-5, atol=1e-6)
    shorter = context_losses(transformer, tokens, positions, [W - 1], batch_size=6)
    assert np.abs(shorter[0] - capped[0]).max() > 1e-4
    recurrent = context_losses(lstm, tokens, positions, [W, 20], batch_size=6)
    assert np.abs(recurrent[1] - recurrent[0]).max() > 1e-4


def test_score_document_reads_either_baseline(transformer, lstm):
    for model in (transformer, lstm):
        nll, mask = score_document(model, TOKENS, tgt_len=3)
        whole, _ = score_document(model, TOKENS, tgt_len=16)
        assert to_numpy(mask).all()
        np.testing.assert_allclose(to_numpy(nll), to_numpy(whole), rtol=1e-5, atol=1e-5)


# -- saving, the factory, the memory holders ----------------------------------------------------

@pytest.mark.parametrize("architecture", ["lstm", "transformer"])
def test_a_keras_file_round_trip_keeps_the_model(architecture, tmp_path):
    model = baseline(architecture, cutoffs=(10,), div_val=2, d_embed=16)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert type(loaded) is type(model) and loaded.config == model.config
    memory = model.init_key_value_ring(2)
    want, _ = model(TOKENS[:, :4], memory)
    got, _ = loaded(TOKENS[:, :4], loaded.init_key_value_ring(2))
    np.testing.assert_allclose(to_numpy(got), to_numpy(want), rtol=1e-6, atol=1e-6)


def test_the_factory_builds_each_architecture_and_transformer_xl_refuses_a_baseline():
    for architecture, cls in [("transformer_xl", TransfoXLLM), ("transformer", TransformerLM),
                              ("lstm", LSTMLM)]:
        config = tiny_config(architecture=architecture)
        assert language_model_class(config) is cls
        assert type(build_language_model(config)) is cls
        assert cls.architecture == architecture
    with pytest.raises(ValueError, match="needs config.architecture 'transformer_xl', got "
                                         "'lstm'"):
        TransfoXLLM(tiny_config(architecture="lstm"))
    with pytest.raises(ValueError, match="LSTMLM is the 'lstm' architecture; "
                                         "config.architecture is 'transformer'"):
        LSTMLM(tiny_config(architecture="transformer"))


def test_the_memory_holders_take_the_baselines_memories(transformer, lstm):
    for empty in (lstm.init_memory(2), transformer.init_key_value_ring(2)):
        holder = MemoryVariables(empty, "m")
        _, memory = (lstm if isinstance(empty, RecurrentState) else transformer)(
            TOKENS[:, :4], empty)
        holder.write(memory)
        assert to_numpy(holder.read().valid).any()
        holder.clear()
        assert not to_numpy(holder.read().valid).any()
        back = as_memory({key: to_numpy(value) for key, value in memory.to_dict().items()})
        assert type(back) is type(memory)


# -- the config and the sizes -------------------------------------------------------------------

def test_architecture_is_a_config_field_validated_and_saved():
    config = tiny_config(architecture="lstm")
    assert json.loads(config.to_json())["architecture"] == "lstm"
    assert TransfoXLConfig.from_json(config.to_json()) == config
    stored = json.loads(tiny_config().to_json())
    del stored["architecture"]  # a config.json written before the field existed
    assert TransfoXLConfig.from_dict(stored).architecture == "transformer_xl"
    with pytest.raises(ValueError, match="^TransfoXLConfig: architecture must be one of "
                                         "transformer_xl, transformer, lstm, got 'gru'$"):
        tiny_config(architecture="gru")


@pytest.mark.parametrize("architecture", ["transformer_xl", "transformer", "lstm"])
def test_the_parameter_count_and_the_footprint_of_each_architecture(architecture):
    from tfxl import sizing
    config = tiny_config(architecture=architecture, cutoffs=(10,), div_val=2, d_embed=16)
    model = build_language_model(config)
    assert sizing.parameter_count(config) == sum(
        int(np.prod(v.shape)) for v in model.trainable_variables)
    footprint = sizing.training_footprint(config, 4, eval_settings=config.eval_settings())
    assert footprint.total > 0 and footprint.activations
    state = sizing.training_memory_row_bytes(config)
    assert state == {"transformer_xl": 4 * 2 * 4 * 16, "transformer": 0,
                     "lstm": 2 * 4 * 2 * 16}[architecture]
    assert footprint.memory_state == 2 * 4 * state
    assert sum(sizing.evaluation_footprint(config, 4, 8, 16).values()) > 0
