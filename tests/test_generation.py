"""Generation on the key/value memory against the same loop on the layer-input memory."""

import weakref

import numpy as np
import pytest
import tensorflow as tf

from factories import tiny_lm
from tfxl.models import generation
from tfxl.models.generation import generate
from tfxl.models.sampling import sample_next

MEM = 6  # shorter than prompt + new tokens: the memory slides during generation


@pytest.fixture(scope="module")
def lm():
    return tiny_lm(vocab_size=41, d_head=8, d_inner=32, eval_mem_len=MEM, eval_clamp_len=4,
                   eval_same_length=True, pre_lnorm=True, untie_r=True, cutoffs=(20,), div_val=2,
                   init_std=0.3)


_STEPS = weakref.WeakKeyDictionary()  # model -> its reference step (layer_input_step)


def layer_input_step(lm):
    """The reference's step: one model call on the layer-input memory with the generation's
    settings (clamp_len 4, same_length), as one tf.function per model that every case shares:
    one trace per memory shape, not hundreds of eager Keras calls nor one trace per case."""
    if lm not in _STEPS:
        _STEPS[lm] = tf.function(lambda ids, memory: lm(ids, memory, clamp_len=4,
                                                        same_length=True))
    return _STEPS[lm]


def layer_input_generation(lm, prompt, n, temperature, top_k, top_p, seed, mem_len=MEM):
    """The reference: one model call per token on the layer-input memory, in Python. Returns
    (tokens [B, n], the step it called)."""
    run = dict(clamp_len=4, same_length=True)
    step = layer_input_step(lm)
    log_probs, memory = lm(prompt, lm.init_memory(len(prompt), mem_len=mem_len), **run)
    last, out = log_probs[:, -1], []
    for i in range(n):
        token = sample_next(last, temperature, top_k, top_p,
                            tf.constant([generation.token_seed(seed, i), 0]))
        out.append(token.numpy())
        log_probs, memory = step(token[:, None], memory)
        last = log_probs[:, 0]
    return np.stack(out, axis=1), step


@pytest.mark.parametrize("temperature,top_k,top_p,seed", [
    pytest.param(0.0, 0, 1.0, 0, marks=pytest.mark.large), (1.0, 10, 0.9, 7), (0.7, 0, 1.0, 3)])
def test_key_value_generation_gives_the_tokens_of_the_layer_input_path(lm, temperature, top_k,
                                                                       top_p, seed):
    prompt = np.random.default_rng(seed).integers(0, 41, (2, 5)).astype(np.int32)
    want, _ = layer_input_generation(lm, prompt, 9, temperature, top_k, top_p, seed)
    got, memory = generate(lm, prompt, lm.init_key_value_memory(2), 9, temperature, top_k,
                           top_p, seed, clamp_len=4, same_length=True)
    np.testing.assert_array_equal(got.numpy(), want)
    assert memory.to_dict()["keys"].shape == (2, 2, 2, 8, MEM) and memory.valid.numpy().all()
    # The Keras-style method runs the same loop with the config's evaluation settings.
    np.testing.assert_array_equal(lm.generate(prompt, 9, temperature, top_k, top_p, seed), want)
    np.testing.assert_array_equal(lm.generate(prompt[0], 9, temperature, top_k, top_p, seed),
                                  want[0])
    # One compiled loop per memory length, whatever the prompts' batch and length.
    lm.generate(prompt[:, :2], 2)
    assert lm._generate_loops[MEM].experimental_get_tracing_count() == 1


def test_generation_continues_a_layer_input_memory_exactly(lm):
    rng = np.random.default_rng(5)
    context, prompt = rng.integers(0, 41, (1, 8)), rng.integers(0, 41, (1, 2))
    _, states = lm(context, lm.init_memory(1, mem_len=MEM), clamp_len=4, same_length=True)
    from_states, _ = generate(lm, prompt, states, 6, 0.0, clamp_len=4, same_length=True)
    from_key_value, _ = generate(lm, prompt, lm.key_value_memory(states), 6, 0.0, clamp_len=4,
                                 same_length=True)
    np.testing.assert_array_equal(from_states.numpy(), from_key_value.numpy())


def test_generate_method_refuses_an_empty_prompt_and_a_seed_outside_int32(lm):
    with pytest.raises(ValueError, match="prompt_ids"):
        lm.generate(np.zeros((1, 0), np.int32), 3)
    for seed in (2**31, -2**31 - 1):  # 2**31 was taken as int64 and wrapped to -2**31
        with pytest.raises(ValueError, match=f"seed must be an int32, .*got {seed}"):
            lm.generate(np.ones((1, 2), np.int32), 3, seed=seed)


@pytest.mark.parametrize("window,mem_len,n", [(1, MEM, 7), (3, MEM, 14), (4, 9, 30), (32, 40, 75),
                                              (8, 0, 12)])
def test_recent_window_merges_keep_the_tokens_exact(lm, monkeypatch, window, mem_len, n):
    """Window sizes around and below M, several merges, and no memory at all. The long cases
    run the loop in a graph, as every front end runs it (lm.generate, the exports,
    tfxl-generate): one trace (about 3 s) rather than n eager Keras steps (about 0.1 s each);
    the short ones run it eagerly, as the Python API may be called."""
    monkeypatch.setattr(generation, "RECENT_WINDOW", window)
    prompt = np.random.default_rng(window).integers(0, 41, (2, 3)).astype(np.int32)
    run = dict(clamp_len=4, same_length=True)
    want, step = layer_input_generation(lm, prompt, n, 0.9, 0, 1.0, 11, mem_len=mem_len)
    loop = lambda prompt, memory: generate(lm, prompt, memory, n, 0.9, seed=11, **run)
    if n >= 30:
        loop = tf.function(loop)
    got, got_memory = loop(prompt, lm.init_key_value_memory(2, mem_len=mem_len))
    np.testing.assert_array_equal(got.numpy(), want)
    # The returned memory is the one the layer-input loop had before reading the last token.
    _, before_last = lm(prompt, lm.init_memory(2, mem_len=mem_len), **run)
    for i in range(n - 1):
        _, before_last = step(got.numpy()[:, i:i + 1], before_last)
    want_memory = lm.key_value_memory(before_last)
    for name in ("keys", "values"):
        np.testing.assert_allclose(got_memory.to_dict()[name].numpy(),
                                   want_memory.to_dict()[name].numpy(), atol=1e-5)
    np.testing.assert_array_equal(got_memory.valid.numpy(), want_memory.valid.numpy())


@pytest.fixture(scope="module")
def generate_four(lm):
    """generate(prompt, memory) of four tokens at temperature 1, in-graph: one tf.function that
    the cases share (one trace of the loop, not one per case)."""
    return tf.function(lambda prompt, memory: generate(lm, prompt, memory, 4, temperature=1.0))


@pytest.mark.parametrize("where", ["keys", "values"])
def test_generation_refuses_non_finite_log_probs_rather_than_draw_an_id_outside_the_vocabulary(
        lm, generate_four, where):
    """A finite memory can still overflow (keys or values near float32's maximum give NaN
    log-probs), from which the sampler drew id V for every token (41 here). Refused, in the
    Python API as in the exported signatures (which refuse non-finite memory at the entry)."""
    memory = lm.init_key_value_memory(2, mem_len=MEM)
    huge = tuple(tf.fill(tf.shape(tensor), 3e38) for tensor in getattr(memory, where))
    memory = memory._replace(valid=tf.ones_like(memory.valid), **{where: huge})
    prompt = np.ones((2, 3), np.int32)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="generate: the next-token log-probabilities are not finite"):
        ids, _ = generate_four(prompt, memory)
        assert ids.numpy().max() < 41, ids.numpy()


@pytest.fixture(scope="module")
def one_token_step(lm):
    """tfxl-generate's call: one token after `ids` on a key/value memory, seeded per call; one
    tf.function that the seeds share, of any prompt length as tfxl-generate's (one trace for
    the prompt and every later token, not one per prompt length or case)."""
    memory = lm.init_key_value_memory(1, mem_len=MEM)
    signature = [tf.TensorSpec([None, None], tf.int32),
                 tf.nest.map_structure(tf.TensorSpec.from_tensor, memory),
                 tf.TensorSpec([], tf.int32)]
    return tf.function(lambda ids, memory, seed: generate(lm, ids, memory, 1, 1.0, 0, 1.0, seed,
                                                          clamp_len=4, same_length=True),
                       input_signature=signature)


@pytest.mark.parametrize("seed", [0, 2148, 2**31 - 1, -2**31])
def test_one_token_per_call_with_token_seed_draws_the_tokens_of_one_call(lm, one_token_step,
                                                                         seed):
    """tfxl-generate streams one token per call, seeded token_seed(seed, i): the same tokens as
    TransfoXLLM.generate(seed=seed), over the whole int32 range (seed * 1_000_003 + i, its old
    formula, drew other tokens and left int32 from --seed=2148)."""
    prompt = np.array([[3, 1, 4, 1, 5]], np.int32)
    want = lm.generate(prompt, 6, temperature=1.0, seed=seed)
    memory, ids, got = lm.init_key_value_memory(1, mem_len=MEM), prompt, []
    for i in range(6):
        stream_seed = generation.token_seed(seed, i)
        assert generation.INT32_SEEDS[0] <= stream_seed <= generation.INT32_SEEDS[1]
        token, memory = one_token_step(ids, memory, tf.constant(stream_seed, tf.int32))
        got.append(int(token[0, 0]))
        ids = token
    np.testing.assert_array_equal(got, want[0])
    assert one_token_step.experimental_get_tracing_count() == 1
    assert generation.token_seed(seed, 5) == int(generation.token_seed(tf.constant(seed), 5))


def read_in_segments(lm, prompt, segment_len, same_length):
    """The reference reading of a prompt as evaluation reads a document: segments of
    `segment_len` on a fresh key/value memory, the last one holding the 1..T tokens left."""
    memory = lm.init_key_value_memory(len(prompt))
    starts = list(range(0, prompt.shape[1] - 1, segment_len))
    for start in starts:
        log_probs, memory = lm(prompt[:, start:start + segment_len], memory, clamp_len=4,
                               same_length=same_length)
    return log_probs[:, -1], memory


@pytest.mark.parametrize("same_length", [True, False])
def test_a_long_prompt_is_read_in_segments_of_the_eval_tgt_len_on_the_memory(lm, same_length):
    """A prompt longer than memory + segment is read segment by segment (T = the eval tgt_len,
    4 here) on the memory, as score_document reads a document: attention over at most M + T
    keys, never P x P. The memory after the prompt (max_new_tokens=1 reads nothing more) and
    the greedy token are those of the segment-by-segment reading."""
    prompt = np.random.default_rng(5).integers(0, 41, (2, 4 * 4 + 3)).astype(np.int32)
    last, want = read_in_segments(lm, prompt, 4, same_length)
    got, memory = generate(lm, prompt, lm.init_key_value_memory(2), 1, 0.0, clamp_len=4,
                           same_length=same_length)
    np.testing.assert_array_equal(got.numpy()[:, 0], np.argmax(last.numpy(), axis=-1))
    for name in ("keys", "values"):
        for layer, (a, b) in enumerate(zip(getattr(memory, name), getattr(want, name))):
            np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5, err_msg=f"{name} {layer}")
    np.testing.assert_array_equal(memory.valid.numpy(), want.valid.numpy())


@pytest.mark.parametrize("same_length", [True, False])
@pytest.mark.parametrize("length", [3, 4, MEM])
def test_a_prompt_the_memory_holds_gives_the_tokens_of_one_segment(lm, same_length, length):
    """Where a prompt fits both ways (P <= T: one segment either way; P <= M on a fresh memory:
    every query sees every earlier token either way, with same_length too, whose M + 1 keys
    reach back past the prompt's start), reading it in segments of T = 4 gives the tokens and
    memory of reading it as one segment (tgt_len=P)."""
    prompt = np.random.default_rng(length).integers(0, 41, (2, length)).astype(np.int32)
    run = dict(clamp_len=4, same_length=same_length)
    one, one_memory = generate(lm, prompt, lm.init_key_value_memory(2), 7, 0.8, 0, 1.0, 3,
                               tgt_len=length, **run)
    segments, memory = generate(lm, prompt, lm.init_key_value_memory(2), 7, 0.8, 0, 1.0, 3,
                                tgt_len=4, **run)
    np.testing.assert_array_equal(segments.numpy(), one.numpy())
    for a, b in zip(memory.keys, one_memory.keys):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5)


def test_generate_method_refuses_sizes_no_machine_holds_before_building_anything(lm):
    """A memory or a token buffer over 2 GiB is a ValueError naming the argument, before any
    tensor of that size is allocated (not an out-of-memory error from deep inside)."""
    prompt = np.array([[1, 2, 3]], np.int32)
    with pytest.raises(ValueError, match=r"^mem_len=1000000000: a key/value memory of "):
        lm.generate(prompt, 2, mem_len=10**9)
    with pytest.raises(ValueError, match=r"^max_new_tokens=1000000000: at most 536870912 new"):
        lm.generate(prompt, 10**9)
