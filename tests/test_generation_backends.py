"""Generation and whole-document scoring on every backend: the key/value loop gives the tokens
of a step-by-step loop on the layer-input memory (greedy and sampled, across window merges,
eagerly, compiled and through `TransfoXLLM.generate`), `score_document` the NLL of segment-by-
segment model calls, and a non-finite step is refused as documented per backend.

(tests/test_generation.py holds the TensorFlow-specific cases: dynamic lengths, one trace per
memory length, the one-token-per-call stream; tests/test_backends.py checks that a seed draws
the same tokens on TensorFlow and on JAX, on the same weights.)
"""

import keras
import numpy as np
import pytest
from keras import ops

from backends import BACKEND, compiled, to_numpy
from factories import tiny_lm
from tfxl.models import generation
from tfxl.models.generation import generate
from tfxl.models.sampling import sample_next
from tfxl.models.scoring import score_document

pytestmark = pytest.mark.every_backend

MEM, WINDOW, NEW = 6, 3, 7  # 7 new tokens through a 3-slot window: it merges twice
RUN = dict(clamp_len=4, same_length=True)  # the lm's evaluation settings, as generate's
SAMPLED = (1.0, 10, 0.9, 7)  # temperature, top_k, top_p, seed


@pytest.fixture(scope="module")
def lm():
    keras.utils.set_random_seed(0)  # the same weights whichever test builds it
    return tiny_lm(vocab_size=41, d_head=8, d_inner=32, eval_mem_len=MEM, eval_clamp_len=4,
                   eval_same_length=True, pre_lnorm=True, untie_r=True, cutoffs=(20,), div_val=2,
                   init_std=0.3)


@pytest.fixture(scope="module")
def prompt():
    return np.random.default_rng(5).integers(0, 41, (2, 5)).astype(np.int32)


@pytest.fixture(scope="module")
def reference(lm, prompt):
    """reference(temperature, top_k, top_p, seed) -> (tokens [B, NEW], the key/value memory
    before the last token): one compiled model call per token on the layer-input memory."""
    step = compiled(lambda ids, memory: lm(ids, memory, **RUN))
    cache = {}

    def run(temperature, top_k, top_p, seed):
        if (temperature, top_k, top_p, seed) not in cache:
            log_probs, memory = step(prompt, lm.init_memory(len(prompt), mem_len=MEM))
            tokens = []
            for i in range(NEW):
                before_last = memory
                token = sample_next(log_probs[:, -1], temperature, top_k, top_p,
                                    ops.convert_to_tensor([generation.token_seed(seed, i), 0],
                                                          "int32"))
                tokens.append(to_numpy(token))
                log_probs, memory = step(to_numpy(token)[:, None], memory)
            cache[temperature, top_k, top_p, seed] = (np.stack(tokens, axis=1),
                                                      lm.key_value_memory(before_last))
        return cache[temperature, top_k, top_p, seed]
    return run


@pytest.fixture(scope="module")
def compiled_generate(lm):
    """generate(prompt, memory) of NEW sampled tokens through the 3-slot window, compiled (XLA
    on TensorFlow, jax.jit): one trace that the tests share. Returns numpy (ids, memory)."""
    loop = compiled(lambda prompt, memory: generate(lm, prompt, memory, NEW, *SAMPLED, **RUN))

    def run(prompt, memory):
        with pytest.MonkeyPatch.context() as patch:  # read when the loop is traced
            patch.setattr(generation, "RECENT_WINDOW", WINDOW)
            ids, memory = loop(prompt, memory)
        return to_numpy(ids), memory
    return run


def assert_same_memory(got, want):
    for name in ("keys", "values"):
        np.testing.assert_allclose(to_numpy(got.to_dict()[name]), to_numpy(want.to_dict()[name]),
                                   atol=1e-5)
    np.testing.assert_array_equal(to_numpy(got.valid), to_numpy(want.valid))


@pytest.mark.large
@pytest.mark.parametrize("sampling", [(0.0, 0, 1.0, 0), SAMPLED], ids=["greedy", "sampled"])
def test_generation_gives_the_tokens_and_memory_of_the_step_by_step_loop(lm, prompt, reference,
                                                                        monkeypatch, sampling):
    monkeypatch.setattr(generation, "RECENT_WINDOW", WINDOW)
    want, want_memory = reference(*sampling)
    got, memory = generate(lm, prompt, lm.init_key_value_memory(2), NEW, *sampling, **RUN)
    np.testing.assert_array_equal(to_numpy(got), want)
    assert_same_memory(memory, want_memory)  # the loop's before it read the last token


@pytest.mark.large
def test_compiled_generation_and_the_generate_method_give_the_same_tokens(lm, prompt, reference,
                                                                          compiled_generate):
    want, want_memory = reference(*SAMPLED)
    got, memory = compiled_generate(prompt, lm.init_key_value_memory(2))
    np.testing.assert_array_equal(got, want)
    assert_same_memory(memory, want_memory)
    # The Keras-style method (each backend's compiled loop) on the config's evaluation settings.
    np.testing.assert_array_equal(lm.generate(prompt, NEW, *SAMPLED), want)


@pytest.mark.large
def test_non_finite_log_probs_are_refused_eagerly_and_marked_when_compiled(lm, prompt,
                                                                           compiled_generate,
                                                                           monkeypatch):
    """Keys near float32's maximum in row 0 overflow its attention (NaN log-probs): no token can
    be drawn. Eagerly: TensorFlow's InvalidArgumentError, ValueError elsewhere. Compiled (XLA
    drops TensorFlow's assertion; jax.jit cannot raise): row 0's ids are -1, row 1's drawn as
    usual. TransfoXLLM.generate raises on such ids."""
    memory = lm.init_key_value_memory(2)
    keys = tuple(ops.concatenate([ops.full(ops.shape(k[:1]), 3e38), k[1:]], axis=0)
                 for k in memory.keys)
    memory = memory._replace(keys=keys, valid=ops.ones_like(memory.valid))
    error = ValueError
    if BACKEND == "tensorflow":
        import tensorflow as tf
        error = tf.errors.InvalidArgumentError
    with pytest.raises(error, match="generate: the next-token log-probabilities are not finite"):
        generate(lm, prompt, memory, NEW, *SAMPLED, **RUN)
    if BACKEND != "torch":  # compiled means eager there: it raised above
        ids, _ = compiled_generate(prompt, memory)
        assert (ids[0] == generation.NO_TOKEN).all() and (ids[1] >= 0).all(), ids
    monkeypatch.setattr(generation, "compiled_generate", lambda *args: lambda ids, n, *_: (
        np.full((len(ids), n), generation.NO_TOKEN, np.int32)))
    with pytest.raises(ValueError, match="log-probabilities are not finite"):
        lm.generate(prompt, NEW, mem_len=MEM + 1)  # a memory length with no loop yet
    del lm._generate_loops[MEM + 1]


@pytest.mark.large
def test_score_document_equals_segment_by_segment_model_calls(lm):
    """Two rows of 11 tokens: 10 targets in segments of T = 4 (the last one padded) on a memory of
    6, eagerly and compiled, against the model called segment by segment; a target mask only
    zeroes the targets it drops."""
    ids = np.random.default_rng(1).integers(0, 41, (2, 11)).astype(np.int32)
    memory, want = lm.init_key_value_memory(2, MEM), []
    for start in range(0, 10, 4):
        nll, memory = lm(ids[:, start:min(start + 4, 10)], memory,
                         targets=ids[:, start + 1:start + 5], **RUN)
        want.append(to_numpy(nll))
    want = np.concatenate(want, axis=1)
    mask = np.arange(10) < np.array([[10], [7]])
    settings = dict(tgt_len=4, mem_len=MEM, **RUN)
    nll, got_mask = score_document(lm, ids, mask, **settings)
    np.testing.assert_allclose(to_numpy(nll), np.where(mask, want, 0.0), atol=1e-5)
    np.testing.assert_array_equal(to_numpy(got_mask), mask)
    graph_nll = compiled(lambda x: score_document(lm, x, **settings)[0])(ids)
    np.testing.assert_allclose(to_numpy(graph_nll), want, atol=1e-5)


def test_token_seed_of_tensors_is_the_python_rule_eagerly_and_compiled():
    """The per-token seed wraps modulo 2^32 on every backend (uint32 arithmetic: PyTorch keeps
    Keras' uint32 in int64)."""
    seeds = [0, 2148, 2**31 - 1, -2**31, -7]
    want = [[generation.token_seed(seed, step) for step in (0, 1, 5, 4000)] for seed in seeds]
    seed = ops.convert_to_tensor(seeds, "int32")[:, None]
    step = ops.convert_to_tensor([0, 1, 5, 4000], "int32")[None, :]
    for fn in (generation.token_seed, compiled(generation.token_seed)):
        got = fn(seed, step)
        assert ops.dtype(got) == "int32"
        np.testing.assert_array_equal(to_numpy(got), want)
