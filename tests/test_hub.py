"""tfxl.hub: Transformer-XL as a keras-hub CausalLM, checked against tfxl's own model and
generation. The models run on every backend; the tokenizer, the preprocessors, bucket presets and
the references that use `TransfoXLLM.generate` (TensorFlow code today) are `tensorflow_only`."""

import collections
import itertools
import json
import logging
import os
import subprocess
import sys
import weakref

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf

from backends import compiled, to_numpy
from factories import tiny_lm
from tfxl.data.errors import DataError
from tfxl.data.tokenizers import BytesTokenizer, WordsTokenizer
from tfxl.hub import (TransfoXLCausalLM, TransfoXLTextClassifier, TransfoXLTokenizer,
                      causal_lm_from_model, causal_lm_from_model_dir)

pytestmark = pytest.mark.every_backend

MEM = 5  # shorter than the longest prompt and than prompt + new tokens
LENGTH = 20  # keras-hub's max_length: prompt + generated
PROMPT_LENGTHS = (3, 9, 6)  # a batch of different lengths, one longer than MEM


def language_model(**changes):
    # init_std 0.3: log-probabilities far enough apart that greedy choices are not near-ties.
    return tiny_lm(**{**dict(vocab_size=41, d_head=8, d_inner=32, eval_mem_len=MEM, cutoffs=(20,),
                             div_val=2, untie_r=True, pre_lnorm=True, init_std=0.3), **changes})


def padded(prompts, length=LENGTH):
    """keras-hub's generate input: prompts left-aligned, padded to `length`."""
    ids = np.zeros((len(prompts), length), np.int32)
    mask = np.zeros((len(prompts), length), bool)
    for row, prompt in enumerate(prompts):
        ids[row, :len(prompt)], mask[row, :len(prompt)] = prompt, True
    return {"token_ids": ids, "padding_mask": mask}


def random_prompts(vocab_size, lengths=PROMPT_LENGTHS, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab_size, n).astype(np.int32) for n in lengths]


@pytest.mark.large
@pytest.mark.tensorflow_only
@pytest.mark.parametrize("settings,mem_len", [
    (dict(), None),  # every prompt token sees the whole prompt before it
    # The prompt read M + 1 positions deep; mem_len= overrides eval_mem_len.
    (dict(eval_same_length=True, eval_clamp_len=3, eval_mem_len=8, pre_lnorm=False,
          untie_r=False), 3),
])
def test_greedy_generate_is_tfxls_greedy_generation_token_for_token(settings, mem_len):
    lm = language_model(**settings)
    causal_lm = causal_lm_from_model(lm, mem_len=mem_len)
    # Without XLA: the compiled path is test_generate_compiled_with_xla_gives_the_same_tokens's.
    causal_lm.compile(sampler="greedy", jit_compile=False)
    prompts = random_prompts(41)
    got = causal_lm.generate(padded(prompts), stop_token_ids=None)
    assert got["padding_mask"].all()
    for row, prompt in enumerate(prompts):
        want = lm.generate(prompt, LENGTH - len(prompt), temperature=0.0, mem_len=mem_len)
        np.testing.assert_array_equal(got["token_ids"][row, :len(prompt)], prompt)
        np.testing.assert_array_equal(got["token_ids"][row, len(prompt):], want)
    # A stop token: each row is kept up to its first one after the prompt.
    stop = int(got["token_ids"][0, len(prompts[0]) + 2])
    stopped = causal_lm.generate(padded(prompts), stop_token_ids=[stop])
    for row, prompt in enumerate(prompts):
        after = np.flatnonzero(got["token_ids"][row, len(prompt):] == stop)
        kept = len(prompt) + after[0] + 1 if after.size else LENGTH
        np.testing.assert_array_equal(stopped["padding_mask"][row],
                                      np.arange(LENGTH) < kept)
        np.testing.assert_array_equal(stopped["token_ids"][row, :kept],
                                      got["token_ids"][row, :kept])


@pytest.mark.large
@pytest.mark.tensorflow_only
def test_generate_compiled_with_xla_gives_the_same_tokens():
    lm = language_model(eval_same_length=True)
    causal_lm = causal_lm_from_model(lm)
    causal_lm.compile(sampler="greedy", jit_compile=True)
    assert causal_lm.jit_compile  # keras-hub compiles generate_step with XLA when this is set
    prompts = random_prompts(41, seed=1)
    got = causal_lm.generate(padded(prompts), stop_token_ids=None)["token_ids"]
    for row, prompt in enumerate(prompts):
        want = lm.generate(prompt, LENGTH - len(prompt), temperature=0.0)
        np.testing.assert_array_equal(got[row, len(prompt):], want)


@pytest.mark.parametrize("sampler", [keras_hub.samplers.TopKSampler(k=5, seed=3),
                                     keras_hub.samplers.TopPSampler(p=0.9, seed=3)],
                         ids=["top_k", "top_p"])
def test_random_samplers_keep_the_prompt_and_draw_valid_ids(sampler):
    causal_lm = causal_lm_from_model(language_model())
    causal_lm.compile(sampler=sampler, jit_compile=False)  # XLA: tested with greedy above
    prompts = random_prompts(41, seed=2)
    ids = causal_lm.generate(padded(prompts), stop_token_ids=None)["token_ids"]
    assert ids.min() >= 0 and ids.max() < 41
    for row, prompt in enumerate(prompts):
        np.testing.assert_array_equal(ids[row, :len(prompt)], prompt)


@pytest.mark.parametrize("sampler", ["contrastive", keras_hub.samplers.ContrastiveSampler()],
                         ids=["name", "instance"])
def test_contrastive_sampler_is_refused_with_tfxls_message(sampler):
    causal_lm = causal_lm_from_model(language_model())
    causal_lm.compile(sampler="greedy")
    with pytest.raises(ValueError, match="TransfoXLCausalLM: the contrastive sampler is not "
                                         "supported .* use greedy, top_k, top_p, random or beam"):
        causal_lm.compile(sampler=sampler)
    assert isinstance(causal_lm.sampler, keras_hub.samplers.GreedySampler)  # kept


@pytest.mark.large
@pytest.mark.tensorflow_only
def test_switching_samplers_does_not_warn_of_retracing():
    """Each compile traces its own generate function once: no "triggered tf.function retracing"
    warning (it came at the fifth sampler), and each sampler still draws valid ids."""
    causal_lm = causal_lm_from_model(language_model())
    prompts = padded(random_prompts(41, lengths=(2, 3), seed=6), length=6)
    warnings = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())
    logger = logging.getLogger("tensorflow")
    logger.addHandler(handler)
    try:
        for sampler in ("greedy", "top_k", "top_p", "random", "beam", "greedy"):
            causal_lm.compile(sampler=sampler)
            ids = causal_lm.generate(prompts, stop_token_ids=None)["token_ids"]
            assert ids.min() >= 0 and ids.max() < 41
    finally:
        logger.removeHandler(handler)
    assert not [w for w in warnings if "retracing" in w], warnings


_STEPS = weakref.WeakKeyDictionary()  # model -> its one-token step (tfxl_step_log_probs)


def tfxl_step_log_probs(lm, prompts, continuations):
    """tfxl's generation semantics, teacher-forced: prompts [R, P] read as one segment on an
    empty memory, then the continuations [R, N] one token per step on the memory. Returns the
    log-probabilities [R, N + 1, V] after the prompt and after each continuation token."""
    settings = lm.config.eval_settings()
    run = dict(clamp_len=settings["clamp_len"], same_length=settings["same_length"])
    log_probs, memory = lm(prompts, lm.init_key_value_memory(len(prompts)), **run)
    if lm not in _STEPS:  # one compiled step per model: one trace for every row and step
        _STEPS[lm] = compiled(lambda ids, memory: lm(ids, memory, **run))
    step = _STEPS[lm]
    steps = [to_numpy(log_probs)[:, -1]]
    for i in range(continuations.shape[1]):
        log_probs, memory = step(continuations[:, i:i + 1], memory)
        steps.append(to_numpy(log_probs)[:, 0])
    return np.stack(steps, axis=1)


@pytest.mark.large
def test_the_hub_models_give_the_tfxl_models_outputs_and_greedy_generation_its_argmax():
    """On every backend: the backbone's hidden states and the CausalLM's log-probabilities are
    the tfxl model's on the same padded segment; greedy `generate` picks, at every step, the
    argmax of tfxl's log-probabilities on the tokens before it (teacher-forced: no reference
    generation needed); the text classifier reads the same backbone."""
    lm = language_model()
    causal_lm = causal_lm_from_model(lm)
    prompts = random_prompts(41)
    x = padded(prompts)
    hidden, _ = lm.backbone(x["token_ids"], segment_valid=x["padding_mask"])
    np.testing.assert_allclose(to_numpy(causal_lm.backbone(x)), to_numpy(hidden), atol=1e-5)
    log_probs, _ = lm(x["token_ids"], segment_valid=x["padding_mask"])
    np.testing.assert_allclose(to_numpy(causal_lm(x)), to_numpy(log_probs), atol=1e-5)

    causal_lm.compile(sampler="greedy")
    got = to_numpy(causal_lm.generate(x, stop_token_ids=None)["token_ids"])
    for row, prompt in enumerate(prompts):
        n = len(prompt)
        np.testing.assert_array_equal(got[row, :n], prompt)
        steps = tfxl_step_log_probs(lm, got[row:row + 1, :n], got[row:row + 1, n:LENGTH - 1])[0]
        np.testing.assert_array_equal(got[row, n:], steps.argmax(axis=-1))
        top2 = np.sort(steps, axis=-1)[:, -2:]
        assert (top2[:, 1] - top2[:, 0] > 1e-4).all()  # no near-tie decides a token

    classifier = TransfoXLTextClassifier(causal_lm.backbone, num_classes=3)
    assert to_numpy(classifier(x)).shape == (len(prompts), 3)


@pytest.mark.large
@pytest.mark.parametrize("settings", [dict(), dict(eval_same_length=True, eval_clamp_len=3)])
def test_cache_steps_give_tfxls_log_probabilities(settings):
    # Greedy tokens of a random model settle on a few tokens; this checks every step's numbers.
    lm = language_model(**settings)
    causal_lm = causal_lm_from_model(lm)
    prompts = random_prompts(41)
    x = padded(prompts)
    ids = x["token_ids"]
    rng = np.random.default_rng(6)
    for row, prompt in enumerate(prompts):  # a continuation after each prompt
        ids[row, len(prompt):] = rng.integers(0, 41, LENGTH - len(prompt))
    cache = causal_lm._build_cache(ids, x["padding_mask"])
    got = {}
    for t in range(min(PROMPT_LENGTHS) - 1, LENGTH - 1):
        log_probs, _, cache = causal_lm.call_with_cache(ids[:, t:t + 1], cache, t)
        got[t] = to_numpy(log_probs)[:, 0]
    for row, prompt in enumerate(prompts):
        length = len(prompt)
        want = tfxl_step_log_probs(lm, ids[row:row + 1, :length],
                                   ids[row:row + 1, length:LENGTH - 1])[0]
        np.testing.assert_allclose(np.stack([got[t][row] for t in range(length - 1, LENGTH - 1)]),
                                   want, atol=2e-5)


@pytest.mark.large
def test_beam_search_finds_the_most_likely_continuation():
    # Vocabulary 4 and 16 beams: after two steps every two-token prefix is a beam, so the third
    # step picks the best of all 64 continuations, which the caches reordered along the batch
    # (keras-hub's beam sampler) must score exactly as tfxl does.
    vocab, new = 4, 3
    lm = language_model(vocab_size=vocab, cutoffs=(), div_val=1, eval_mem_len=2, init_std=0.5)
    causal_lm = causal_lm_from_model(lm)
    causal_lm.compile(sampler=keras_hub.samplers.BeamSampler(num_beams=vocab ** (new - 1)))
    prompts = random_prompts(vocab, lengths=(4, 2), seed=4)
    got = causal_lm.generate(padded(prompts, length=4 + new), stop_token_ids=None)["token_ids"]
    every = np.array(list(itertools.product(range(vocab), repeat=new)), np.int32)
    for row, prompt in enumerate(prompts):
        steps = tfxl_step_log_probs(lm, np.repeat(prompt[None], len(every), 0), every[:, :-1])
        scores = np.take_along_axis(steps, every[:, :, None], axis=2).sum(axis=(1, 2))
        generated = got[row, len(prompt):len(prompt) + new]
        assert np.sort(scores)[-1] - np.sort(scores)[-2] > 1e-4  # a unique best
        np.testing.assert_array_equal(generated, every[np.argmax(scores)])


@pytest.mark.large
@pytest.mark.tensorflow_only
def test_preset_round_trip_of_a_trained_model_gives_identical_outputs(tmp_path):
    text = "the cat sat on the mat\nand the dog sat on the log\n"
    tokenizer = WordsTokenizer.build(collections.Counter(text.split()))
    lm = language_model(vocab_size=tokenizer.vocab_size, cutoffs=(6,), eval_same_length=True)
    causal_lm = causal_lm_from_model(lm, tokenizer, sequence_length=12)
    causal_lm.compile(optimizer=keras.optimizers.Adam(1e-2))
    history = causal_lm.fit(["the cat sat on the mat", "the dog sat on the log"] * 4,
                            batch_size=4, epochs=3, shuffle=False, verbose=0)  # keras-hub's fit
    assert history.history["loss"][-1] < history.history["loss"][0]
    preset = str(tmp_path / "preset")
    causal_lm.save_to_preset(preset)
    assert os.path.isfile(os.path.join(preset, "assets", "tokenizer", tokenizer.vocab_filename))
    loaded = keras_hub.models.CausalLM.from_preset(preset)  # local directory: no download
    assert isinstance(loaded, TransfoXLCausalLM)
    assert loaded.backbone.config == lm.config
    for mine, theirs in zip(loaded.backbone.weights, causal_lm.backbone.weights):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    x, _, _ = causal_lm.preprocessor(["the cat sat on", "a dog\nsat"])
    np.testing.assert_array_equal(np.asarray(loaded(x)), np.asarray(causal_lm(x)))
    for model in (causal_lm, loaded):
        model.compile(sampler="greedy")
    prompts = ["the cat", "on the mat\nand"]
    generated = causal_lm.generate(prompts, stop_token_ids=None)
    assert loaded.generate(prompts, stop_token_ids=None) == generated
    assert all(g.startswith(p) for g, p in zip(generated, prompts))
    # The vocabulary file is checked against tokenizer.json's hash when the preset loads.
    with open(os.path.join(preset, "assets", "tokenizer", tokenizer.vocab_filename), "a") as f:
        f.write("extra\n")
    with pytest.raises(DataError, match="does not match"):
        TransfoXLCausalLM.from_preset(preset)


@pytest.mark.large
@pytest.mark.tensorflow_only
def test_text_generation_is_tfxl_generation_of_eod_and_the_encoded_prompt():
    tokenizer = BytesTokenizer()
    lm = language_model(vocab_size=tokenizer.vocab_size, cutoffs=(64,))
    causal_lm = causal_lm_from_model(lm, tokenizer, sequence_length=16)
    causal_lm.compile(sampler="greedy", jit_compile=False)  # XLA: tested with token ids above
    prompts = ["ab", "hello"]
    got = causal_lm.generate(prompts, stop_token_ids=None)
    for text, prompt in zip(got, prompts):
        # keras-hub's generate reads a prompt after the start token: tfxl's <eod>, which begins
        # every document in training.
        ids = np.concatenate([[tokenizer.eod_id], tokenizer.encode(prompt)]).astype(np.int32)
        generated = lm.generate(ids, 16 - len(ids), temperature=0.0)
        # generate() drops <pad> and <eod> from its text; so does the bytes tokenizer's decode.
        assert text == tokenizer.decode(np.concatenate([ids, generated]))


@pytest.mark.tensorflow_only
def test_tokenizer_gives_the_same_ids_eagerly_and_in_a_graph():
    text = "the cat sat\non the mat"
    words = WordsTokenizer.build(collections.Counter(text.split()))
    tokenizer = TransfoXLTokenizer.from_tfxl(words)
    eager = tokenizer(["the cat", "on a mat\nsat"])
    graph = tf.function(tokenizer)(tf.constant(["the cat", "on a mat\nsat"]))
    assert graph.to_list() == eager
    np.testing.assert_array_equal(tokenizer("on the mat"), words.encode("on the mat"))
    assert tokenizer.detokenize(eager) == ["the cat", "on <unk> mat\nsat"]
    assert tokenizer.special_token_ids == sorted({words.pad_id, words.eod_id})
    assert tokenizer.vocabulary_size() == words.vocab_size


@pytest.mark.tensorflow_only
def test_converter_reads_a_keras_file_or_a_model_dir_with_its_data_dir(tmp_path):
    from tfxl.data.prepare import PrepareConfig, prepare
    lm = language_model(vocab_size=258, cutoffs=(64,))
    x = padded(random_prompts(258, seed=5))
    want, _ = lm(x["token_ids"], segment_valid=x["padding_mask"])
    path = str(tmp_path / "lm.keras")
    lm.save(path)
    from_file = causal_lm_from_model_dir(path)
    assert from_file.preprocessor is None
    np.testing.assert_array_equal(np.asarray(from_file(x)), want.numpy())

    text = tmp_path / "corpus.txt"
    text.write_text("def f(x):\n    return x\n" * 50)
    data_dir = str(tmp_path / "data")
    prepare(PrepareConfig(output_dir=data_dir, train=[str(text)], valid=[str(text)],
                          test=[str(text)], tokenizer="bytes", tgt_len=4, num_streams=1),
            log=lambda *a: None)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(lm.config.to_dict()))
    tf.train.CheckpointManager(tf.train.Checkpoint(model=lm), str(model_dir / "checkpoints"),
                               1).save()
    from_dir = causal_lm_from_model_dir(str(model_dir), data_dir, sequence_length=8)
    np.testing.assert_array_equal(np.asarray(from_dir(x)), want.numpy())
    assert from_dir.preprocessor.tokenizer.spec == BytesTokenizer().spec()
    assert from_dir.preprocessor.sequence_length == 8
    other = str(tmp_path / "other.keras")
    language_model().save(other)  # 41 ids
    with pytest.raises(ValueError, match="has a vocabulary of 258 tokens"):
        causal_lm_from_model_dir(other, data_dir)


@pytest.mark.large
@pytest.mark.tensorflow_only
@pytest.mark.subprocess
def test_tfxl_imports_without_keras_hub():
    blocked = ("import sys; sys.modules['keras_hub'] = None\n"
               "import tfxl, tfxl.models, tfxl.models.signatures, tfxl.serving.generate_main\n"
               "try:\n    import tfxl.hub\nexcept ImportError as err:\n    print(err)\n")
    out = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "tfxl.hub needs keras-hub" in out.stdout


@pytest.mark.tensorflow_only
def test_presets_in_a_bucket_are_saved_whole_and_load(tmp_path, monkeypatch):
    """ram:// (TensorFlow's in-memory file system) stands for a bucket: save_to_preset writes
    the whole preset there, config.json last, and no local folder named like it (keras-hub
    alone splits it between the two); keras-hub's from_preset loads it back, as does
    causal_lm_from_model_dir a .keras file there."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))  # keras-hub's download cache
    (tmp_path / "keras_home").mkdir()
    lm = language_model(vocab_size=258, cutoffs=(64,))
    lm.save("ram://hub-test/lm.keras")
    causal_lm = causal_lm_from_model_dir("ram://hub-test/lm.keras", sequence_length=8)
    causal_lm = causal_lm_from_model(lm, BytesTokenizer(), sequence_length=8)
    copied, copy = [], tf.io.gfile.copy
    monkeypatch.setattr(tf.io.gfile, "copy",
                        lambda source, target, overwrite=False:
                        copy(source, target, overwrite) or copied.append(target))
    preset = "ram://hub-test/preset"
    causal_lm.save_to_preset(preset)
    names = {os.path.relpath(path, preset) for path in copied}
    assert {"config.json", "task.json", "model.weights.h5", "tokenizer.json",
            "preprocessor.json"} <= names
    assert copied[-1] == f"{preset}/config.json"
    monkeypatch.setattr(tf.io.gfile, "copy", copy)
    causal_lm.backbone.save_to_preset("ram://hub-test/backbone")
    assert tf.io.gfile.exists("ram://hub-test/backbone/model.weights.h5")
    assert os.listdir(tmp_path) == ["keras_home"]

    loaded = TransfoXLCausalLM.from_preset(preset)
    x = padded(random_prompts(258, seed=5))
    np.testing.assert_array_equal(np.asarray(loaded(x)), np.asarray(causal_lm(x)))
    assert loaded.preprocessor.tokenizer.spec == BytesTokenizer().spec()


@pytest.mark.tensorflow_only
def test_a_preset_saved_over_another_in_a_bucket_is_never_a_mix(tmp_path, monkeypatch):
    """Over an existing preset (replaced, as keras-hub replaces a local one), the old config.json
    goes first and the new one comes last: in between, from_preset refuses the preset. (A local
    directory forced to count as a bucket: ram:// appends to a file copied over another.)"""
    import tfxl.hub.presets
    preset = str(tmp_path / "preset")
    monkeypatch.setattr(tfxl.hub.presets, "is_local", lambda path: os.fspath(path) != preset)
    causal_lm = causal_lm_from_model(language_model(vocab_size=258, cutoffs=(64,)),
                                     BytesTokenizer(), sequence_length=8)
    causal_lm.save_to_preset(preset)
    events, copy, remove = [], tf.io.gfile.copy, tf.io.gfile.remove
    monkeypatch.setattr(tf.io.gfile, "copy", lambda source, target, overwrite=False:
                        copy(source, target, overwrite) or events.append(("copy", target)))
    monkeypatch.setattr(tf.io.gfile, "remove",
                        lambda path: remove(path) or events.append(("remove", path)))
    other = causal_lm_from_model(language_model(vocab_size=258, cutoffs=(64,), init_std=0.5),
                                 BytesTokenizer(), sequence_length=8)
    other.save_to_preset(preset)
    config = os.path.join(preset, "config.json")
    assert events[0] == ("remove", config) and events[-1] == ("copy", config)
    loaded = TransfoXLCausalLM.from_preset(preset)
    for mine, theirs in zip(loaded.backbone.weights, other.backbone.weights):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    events.clear()
    other.preprocessor.save_to_preset(preset)  # writes no config.json: leaves the preset's
    assert ("remove", config) not in events and os.path.exists(config)
