"""SavedModel export, signatures from a TensorFlow-only process and as TF Serving feeds them,
document scoring, generation and sampling."""

import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from factories import (assert_refused_at_the_entry, load_as_served, run_in_process, serve,
                       tiny_lm)
from tfxl import StatefulTransfoXLLM
from tfxl.data.tokenizers import BytesTokenizer
from tfxl.layers.relative_position import RelativePositionEncoding
from tfxl.models.generation import generate
from tfxl.models.sampling import check_sampling, sample_next
from tfxl.models.scoring import score_document
import tfxl.models.signatures as lm_signatures
import tfxl.saved_model.publish as publish
import tfxl.saved_model.signature_set as signature_set
from tfxl.models.signatures import export_saved_model
from tfxl.saved_model.publish import next_version

HERE = os.path.dirname(__file__)
T, MEM = 6, 24  # the export's segment and memory lengths (the config's eval settings)
KEYS_SHAPE, VALUES_SHAPE = (2, 2, 16, MEM), (2, 2, MEM, 16)  # [L, N, H, M], [L, N, M, H]


@pytest.fixture(scope="module")
def model():
    return tiny_lm(vocab_size=258, d_model=32, d_head=16, d_inner=64, tgt_len=T, mem_len=6,
                   eval_mem_len=MEM, init_std=0.1)


@pytest.fixture(scope="module")
def signature_sets():
    """The `Signatures` built in this file, by model and arguments (see `trace_once`)."""
    return {}


def trace_once(monkeypatch, signature_sets):
    """Makes every export in this file of a model with the same arguments (tokenizer, sizes,
    score_top_k) reuse one `Signatures`, so each signature is traced once per file rather than
    once per export: tracing is nearly all of an export's time, and what these tests check
    (where and how an export is written and published, what it answers) does not depend on a
    fresh trace. test_score_top_k_export_and_versions checks that an export traces each
    signature once, and tests of a model of their own trace it themselves."""
    build = lm_signatures.Signatures

    def cached(model, tokenizer=None, *args, **kwargs):
        key = (id(model), None if tokenizer is None else (type(tokenizer), tokenizer.vocab_sha256),
               args, tuple(sorted(kwargs.items())))
        if key not in signature_sets:  # the model is kept: its id is not reused
            signature_sets[key] = model, build(model, tokenizer, *args, **kwargs)
        return signature_sets[key][1]
    monkeypatch.setattr(lm_signatures, "Signatures", cached)


@pytest.fixture
def traced_once(monkeypatch, signature_sets):
    trace_once(monkeypatch, signature_sets)


@pytest.fixture(scope="module")
def exported(model, signature_sets, tmp_path_factory):
    base = str(tmp_path_factory.mktemp("export"))
    with pytest.MonkeyPatch.context() as monkeypatch:
        trace_once(monkeypatch, signature_sets)
        return export_saved_model(model, base, score_top_k=0, tokenizer=BytesTokenizer())


@pytest.fixture(scope="module")
def model_exported(model, signature_sets, tmp_path_factory):
    """keras.Model.export's entry point with the `exported` fixture's arguments."""
    path = tmp_path_factory.mktemp("model_export") / "saved"
    with pytest.MonkeyPatch.context() as monkeypatch:
        trace_once(monkeypatch, signature_sets)
        model.export(str(path), verbose=False, score_top_k=0, tokenizer=BytesTokenizer())
    return path


def reference_nll(model, ids, tgt_len=T, mem_len=MEM, **settings):
    """The training (layer-input memory) path, segment after segment; the last one is shorter."""
    ids = np.asarray(ids)
    states = model.init_memory(ids.shape[0], mem_len=mem_len)
    pieces = []
    for start in range(0, ids.shape[1] - 1, tgt_len):
        targets = ids[:, start + 1:start + 1 + tgt_len]
        nll, states = model(ids[:, start:start + targets.shape[1]], states, targets=targets,
                            **settings)
        pieces.append(nll.numpy())
    return np.concatenate(pieces, axis=1)


def client_inputs(tmp_path):
    """The requests of tests/serving_client.py, written to tmp_path/in.npz."""
    rng = np.random.default_rng(0)
    document = rng.integers(0, 256, (2, 18)).astype(np.int32)
    # 40 tokens = 39 targets: six segments of T = 6 and a last one of 3; the memory (24) slides.
    long_document = rng.integers(0, 256, (2, 40)).astype(np.int32)
    ragged = long_document.copy()
    ragged[1, 23:] = 0  # row 1 has 23 tokens, right-padded
    target_mask = np.ones((2, 39), np.float32)
    target_mask[1, 22:] = 0
    texts = np.array([b"def f(x):\n    return x\n", "naïve\n".encode()])
    prompt = rng.integers(0, 256, (2, 4)).astype(np.int32)
    inputs = dict(document=document, long_document=long_document, ragged_document=ragged,
                  target_mask=target_mask, texts=texts, prompt=prompt)
    np.savez(tmp_path / "in.npz", **inputs)
    return inputs


@pytest.fixture(scope="module")
def client_run(exported, model_exported, tmp_path_factory):
    """One TensorFlow-only process (tests/serving_client.py) for both exports and TensorFlow's
    saved_model_cli: (the inputs, {"exported": outputs, "model_exported": outputs}, the
    saved_model_cli exit status, its output). One process start, not three."""
    tmp_path = tmp_path_factory.mktemp("client")
    inputs = client_inputs(tmp_path)
    result = subprocess.run(
        [sys.executable, os.path.join(HERE, "serving_client.py"), str(tmp_path / "in.npz"),
         "--saved_model_cli", str(exported), str(tmp_path / "shown.txt"),
         str(exported), str(tmp_path / "exported.npz"),
         str(model_exported), str(tmp_path / "model_exported.npz")],
        capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    outputs = {name: np.load(tmp_path / f"{name}.npz", allow_pickle=False)
               for name in ("exported", "model_exported")}
    code, shown = (tmp_path / "shown.txt").read_text().split("\n", 1)
    return inputs, outputs, int(code), shown


@pytest.fixture(scope="module")
def client_expected(model, client_run):
    """What the Python model gives for serving_client.py's requests (computed once for both
    exports that client_run's process called)."""
    inputs = client_run[0]
    document, long_document, ragged, texts, prompt = (inputs[name] for name in (
        "document", "long_document", "ragged_document", "texts", "prompt"))
    tokenizer = BytesTokenizer()
    want = dict(full=model(document, model.init_memory(2, mem_len=0))[0].numpy(),
                document=reference_nll(model, long_document),
                alone=[reference_nll(model, long_document[:1]),
                       reference_nll(model, ragged[1:, :23])],
                texts=[reference_nll(model, np.concatenate(
                    [[tokenizer.eod_id], tokenizer.encode(text.decode())])[None])[0]
                    for text in texts])
    ids, memory = generate(model, prompt, model.init_key_value_memory(2, mem_len=MEM), 7, 0.8,
                           20, 0.9, 5)
    want.update(generated_ids=ids.numpy(), generated_valid=memory.valid.numpy())
    first, second = tokenizer.encode("def f("), tokenizer.encode("import os")
    padded = np.stack([np.concatenate([np.zeros(3, np.int32), first]), second])
    valid = np.ones(padded.shape, bool)
    valid[0, :3] = False
    ids, _ = generate(model, padded, model.init_key_value_memory(2, mem_len=MEM), 7, 0.8, 20,
                      0.9, 5, prompt_valid=valid)
    want["text"] = tokenizer.tf_decode(ids).numpy().astype("S")
    return want


def assert_client_matches(expected, out, inputs):
    """Every output of serving_client.py equals the Python model's (`client_expected`: an export
    with the bytes tokenizer, score_top_k=0, the fixture model's evaluation settings), with no
    tfxl import."""
    texts = inputs["texts"]
    assert not out["tfxl_imported"]
    assert out["init_keys"].shape == (2, *KEYS_SHAPE)
    assert out["init_values"].shape == (2, *VALUES_SHAPE)
    assert out["init_valid"].shape == (2, MEM) and not out["init_valid"].any()

    # Streaming through three `score` requests equals one long pass (memory >= document).
    np.testing.assert_allclose(out["streamed_log_probs"], expected["full"], atol=1e-5)

    # score_document: the whole document in one request = the training path segment by segment.
    want = expected["document"]
    np.testing.assert_allclose(out["document_nll"], want, atol=1e-5)
    np.testing.assert_array_equal(out["document_tokens"], [39, 39])
    np.testing.assert_allclose(out["document_mean_nll"], want.mean(), rtol=1e-5)

    # score_document_masked: each row as if scored alone, 0 where not counted.
    alone = expected["alone"]
    np.testing.assert_allclose(out["masked_nll"][0], alone[0][0], atol=1e-5)
    np.testing.assert_allclose(out["masked_nll"][1, :22], alone[1][0], atol=1e-5)
    assert not out["masked_nll"][1, 22:].any()
    np.testing.assert_array_equal(out["masked_tokens"], [39, 22])
    np.testing.assert_allclose(out["masked_mean_nll"], np.concatenate(alone, 1).sum() / 61,
                               rtol=1e-5)

    # score_text: <eod> + the tokenizer's ids, every text token scored; bpc per row.
    for row, (text, want) in enumerate(zip(texts, expected["texts"])):
        assert out["text_tokens"][row] == want.size == len(text)
        np.testing.assert_allclose(out["text_nll"][row, :want.size], want, atol=1e-5)
        assert not out["text_nll"][row, want.size:].any()
        np.testing.assert_allclose(out["text_bpc"][row], want.mean() / math.log(2), rtol=1e-5)

    # generate and generate_text: the same ids as the Python generation.
    np.testing.assert_array_equal(out["generated_ids"], expected["generated_ids"])
    np.testing.assert_array_equal(out["generated_valid"], expected["generated_valid"])
    np.testing.assert_array_equal(out["text"], expected["text"])

    # encode_text and decode_ids: the tokenizer itself.
    np.testing.assert_array_equal(out["encoded_ids"], BytesTokenizer().encode("naïve"))
    assert out["decoded_text"] == "naïve".encode()


@pytest.mark.subprocess
def test_tensorflow_only_client_matches_the_python_model(client_run, client_expected):
    inputs, outputs, _, _ = client_run
    assert_client_matches(client_expected, outputs["exported"], inputs)


@pytest.mark.subprocess
def test_model_export_runs_every_signature_without_tfxl(model_exported, client_run,
                                                        client_expected):
    """keras.Model.export's entry point writes tfxl-export's signatures (the inherited one fails
    on the (log-probs, memory dict) output of `call`)."""
    inputs, outputs, _, _ = client_run
    assert_client_matches(client_expected, outputs["model_exported"], inputs)
    assert tf.io.gfile.exists(str(model_exported / "assets.extra" / "tfxl_data.json"))


@pytest.mark.large
def test_stateful_model_export_is_the_stateless_tokenizer_less_signatures(model, tmp_path):
    stateful = StatefulTransfoXLLM(model.config, batch_size=2)
    stateful.build()
    stateful.lm.set_weights(model.get_weights())
    path = tmp_path / "stateful"
    stateful.export(str(path), verbose=False)
    signatures = tf.saved_model.load(str(path)).signatures
    assert set(signatures) == {"serving_default", "score", "init_memory", "generate",
                               "score_document", "score_document_masked"}  # no tokenizer
    ids = np.array([[3, 4, 5]], np.int32)
    memory = model.init_key_value_memory(1, mem_len=MEM)
    out = signatures["serving_default"](token_ids=tf.constant(ids), **memory.to_dict())
    full, _ = model(ids, memory)
    want = np.sort(full.numpy(), axis=-1)[..., ::-1][..., :16]  # score_top_k defaults to 16
    np.testing.assert_allclose(out["top_log_probs"].numpy(), want, atol=1e-5)
    assert set(out) == {"top_ids", "top_log_probs", "keys", "values", "valid"}


def test_model_export_refuses_what_it_cannot_write(model, tmp_path):
    for kwargs, message in ((dict(format="onnx"), "format='onnx' is not supported"),
                            (dict(input_signature=[tf.TensorSpec([None, None], tf.int32)]),
                             "input_signature must be None"),
                            (dict(mem_len=-1), "mem_len must be >= 0")):
        with pytest.raises(ValueError, match=message):
            model.export(str(tmp_path / "unused"), verbose=False, **kwargs)
    with pytest.raises(TypeError, match="top_k"):
        model.export(str(tmp_path / "unused"), verbose=False, top_k=3)
    assert not (tmp_path / "unused").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="never overwritten"):
        model.export(str(kept), verbose=False)
    assert [p.name for p in kept.iterdir()] == ["notes.txt"]


SETTINGS = {
    "mem<T": dict(tgt_len=5, mem_len=3),
    "mem>T same_length clamp": dict(tgt_len=4, mem_len=9, same_length=True, clamp_len=3),
    "T > document": dict(tgt_len=32, mem_len=4),
}


@pytest.mark.parametrize("case", SETTINGS, ids=list(SETTINGS))
def test_score_document_equals_the_training_path_segment_by_segment(model, case):
    settings = SETTINGS[case]
    ids = np.random.default_rng(1).integers(0, 258, (3, 23))
    mask = np.ones((3, 22), bool)
    mask[2, 10:] = False
    want = reference_nll(model, ids, **settings)
    nll, got_mask = score_document(model, ids, mask, **settings)
    np.testing.assert_allclose(nll.numpy(), np.where(mask, want, 0), atol=1e-5)
    np.testing.assert_array_equal(got_mask.numpy(), mask)
    graph_nll, _ = tf.function(lambda x: score_document(model, x, **settings))(ids)
    np.testing.assert_allclose(graph_nll.numpy(), want, atol=1e-5)


def test_score_document_projects_positions_once_per_document(model, monkeypatch):
    calls = []
    project = RelativePositionEncoding.call

    def counted(self, *args, **kwargs):
        calls.append(1)
        return project(self, *args, **kwargs)

    monkeypatch.setattr(RelativePositionEncoding, "call", counted)
    score_document(model, np.zeros((1, 40), np.int32))  # eagerly: one loop step per segment
    assert len(calls) == 1


@pytest.mark.subprocess
def test_saved_model_cli_lists_every_signature(client_run):
    """TensorFlow's saved_model_cli (its console script, run in the TensorFlow-only client's
    process) shows `exported`."""
    _, _, code, shown = client_run
    assert code == 0, shown[-2000:]
    for name in ("serving_default", "score", "init_memory", "generate", "score_document",
                 "score_document_masked", "generate_text", "score_text"):
        assert f"signature_def['{name}']" in shown


@pytest.fixture(scope="module")
def serving_session(exported):
    session = load_as_served(exported)
    yield session
    session[0].close()


def zeros(*shape, dtype=np.float32):
    return np.zeros(shape, dtype)


MEMORY = dict(keys=zeros(2, *KEYS_SHAPE), values=zeros(2, *VALUES_SHAPE),
              valid=zeros(2, MEM, dtype=bool))
SAMPLING = dict(max_new_tokens=np.int32(3), temperature=np.float32(1.0), top_k=np.int32(0),
                top_p=np.float32(1.0), seed=np.int32(0))
IDS = np.ones((2, 3), np.int32)
# Every slot valid, one NaN key and two infinite values in valid slots.
VALID_MEMORY = dict(valid=np.ones((2, MEM), bool))
NAN_KEYS = zeros(2, *KEYS_SHAPE)
NAN_KEYS[0, 0, 0, 0, -1] = np.nan
INF_VALUES = zeros(2, *VALUES_SHAPE)
INF_VALUES[1, 1, 1, -1, :2] = [np.inf, -np.inf]
# init_memory's batch bound: 2 GiB over one row's memory (float32 keys and values, bool valid).
MAX_BATCH = 2**31 // (4 * 2 * math.prod(KEYS_SHAPE) + MEM)
# keys: expected [B 2 2 16 M] for batch B, received {}.
KEYS = (f"keys must have shape \\[B, L, N, H, M\\].*=\\] \\[{{}} 2 2 16 {MEM}\\] "
        "\\[but got\\] \\[{}\\]")
BAD_REQUESTS = {
    "score: id >= V": ("score", dict(token_ids=[[1, 300]] * 2, **MEMORY),
                       r"score: token_ids must be token ids in \[0, 258\).* \[1\] \[to\] \[300\]"),
    "score: id < 0": ("score", dict(token_ids=[[-1, 3]] * 2, **MEMORY), r"\[-1\] \[to\] \[3\]"),
    "score: no token": ("score", dict(token_ids=zeros(2, 0, dtype=np.int32), **MEMORY),
                        r"token_ids must have shape \[B, T\] .*T >= 1, but got\] \[2 0\]"),
    "score: ids rank 1": ("score", dict(token_ids=[1, 2], **MEMORY),
                          r"token_ids must have shape \[B, T\].* but got\] \[2\]"),
    "score: ids rank 3": ("score", dict(token_ids=zeros(2, 3, 1, dtype=np.int32), **MEMORY),
                          r"token_ids must have shape \[B, T\].* but got\] \[2 3 1\]"),
    "score: batch mismatch": ("score", dict(token_ids=np.ones((3, 2), np.int32), **MEMORY),
                              "score: " + KEYS.format(3, f"2 2 2 16 {MEM}")),
    "score: keys of another M": (
        "score", dict(token_ids=IDS, **{**MEMORY, "keys": zeros(2, 2, 2, 16, 5)}),
        "score: " + KEYS.format(2, "2 2 2 16 5")),
    "score: keys in the values' layout": (
        "score", dict(token_ids=IDS, **{**MEMORY, "keys": zeros(2, *VALUES_SHAPE)}),
        "score: " + KEYS.format(2, f"2 2 2 {MEM} 16")),
    "score: values of another rank": (
        "score", dict(token_ids=IDS, **{**MEMORY, "values": zeros(2, 2, MEM, 16)}),
        rf"score: values must have shape \[B, L, N, M, H\].*=\] \[2 2 2 {MEM} 16\] "
        rf"\[but got\] \[2 2 {MEM} 16\]"),
    "score: keys of another L": (
        "score", dict(token_ids=IDS, **{**MEMORY, "keys": zeros(2, 3, 2, 16, MEM)}),
        "score: " + KEYS.format(2, f"2 3 2 16 {MEM}")),
    "score: keys of another N": (
        "score", dict(token_ids=IDS, **{**MEMORY, "keys": zeros(2, 2, 4, 16, MEM)}),
        "score: " + KEYS.format(2, f"2 2 4 16 {MEM}")),
    "generate: values of another H": (
        "generate", dict(prompt_ids=IDS, **{**MEMORY, "values": zeros(2, 2, 2, MEM, 8)},
                         **SAMPLING),
        rf"generate: values must have shape \[B, L, N, M, H\].*=\] \[2 2 2 {MEM} 16\] "
        rf"\[but got\] \[2 2 2 {MEM} 8\]"),
    "score: valid of another M": (
        "score", dict(token_ids=IDS, **{**MEMORY, "valid": zeros(2, 5, dtype=bool)}),
        rf"score: valid must have shape \[B, M\].*\[2 {MEM}\] \[but got\] \[2 5\]"),
    "score_document: one token": (
        "score_document", dict(token_ids=IDS[:, :1]),
        r"score_document: token_ids must have shape \[B, S\].* S >= 2, but got\] \[2 1\]"),
    "score_document: id >= V": ("score_document", dict(token_ids=[[1, 258]]),
                                r"token_ids must be token ids in \[0, 258\)"),
    "score_document_masked: mask [B, S]": (
        "score_document_masked", dict(token_ids=IDS, target_mask=zeros(2, 3)),
        r"target_mask must have shape \[B, S - 1\].*\[2 2\] \[but got\] \[2 3\]"),
    "score_document_masked: mask not 0/1": (
        "score_document_masked", dict(token_ids=IDS, target_mask=zeros(2, 2) + 0.5),
        r"target_mask must be 0 or 1, but got values from\] \[0.5\]"),
    "score_text: empty text": ("score_text", dict(text=np.array([b"ab", b""])),
                               r"score_text: text must encode to >= 1 token.*\[2 0\]"),
    "score_text: only empty texts": ("score_text", dict(text=np.array([b""])),
                                     r"score_text: text must encode to >= 1 token.*\[0\]"),
    "score_text: no text": ("score_text", dict(text=np.array([], object)),
                            r"score_text: text must have shape \[B\] with B >= 1.*\[0\]"),
    "score_text: text rank 2": ("score_text", dict(text=np.array([[b"ab"]])),
                                r"text must have shape \[B\].*but got\] \[1 1\]"),
    "generate: top_p 0": ("generate", dict(prompt_ids=IDS, **MEMORY, **{**SAMPLING, "top_p": 0}),
                          r"generate: top_p must be in \(0, 1\].*but got\] \[0\]"),
    "generate: temperature < 0": (
        "generate", dict(prompt_ids=IDS, **MEMORY, **{**SAMPLING, "temperature": -1}),
        r"generate: temperature must be >= 0.*\[-1\]"),
    "generate: top_k < 0": ("generate", dict(prompt_ids=IDS, **MEMORY, **{**SAMPLING, "top_k": -2}),
                            r"generate: top_k must be >= 0.*\[-2\]"),
    "generate: no new token": (
        "generate", dict(prompt_ids=IDS, **MEMORY, **{**SAMPLING, "max_new_tokens": 0}),
        r"generate: max_new_tokens must be >= 1.*\[0\]"),
    "generate: top_k not a scalar": (
        "generate", dict(prompt_ids=IDS, **MEMORY, **{**SAMPLING, "top_k": [1, 2]}),
        r"generate: top_k must have shape \[\] \(a scalar\) =\] \[\] \[but got\] \[2\]"),
    "generate: memory batch": (
        "generate", dict(prompt_ids=IDS[:1], **MEMORY, **SAMPLING),
        "generate: " + KEYS.format(1, f"2 2 2 16 {MEM}")),
    "generate_text: empty prompt": ("generate_text", dict(prompt=np.array([b""]), **SAMPLING),
                                    r"generate_text: prompt must encode to >= 1 token"),
    "generate_text: top_p > 1": (
        "generate_text", dict(prompt=np.array([b"a"]), **{**SAMPLING, "top_p": 1.5}),
        r"generate_text: top_p must be in \(0, 1\]"),
    "init_memory: batch_size 0": (
        "init_memory", dict(batch_size=0),
        r"init_memory: batch_size must be in \[1, \d+\].*but got\] \[0\]"),
    # A 4-byte request must not allocate [2^30, ...]: the bound is the memory a response can hold.
    "init_memory: batch_size 2**30": (
        "init_memory", dict(batch_size=2**30),
        rf"init_memory: batch_size must be in \[1, {MAX_BATCH}\] \(a memory of at most 2 GiB\)"
        r".*but got\] \[1073741824\]"),
    "init_memory: batch_size rank 1": (
        "init_memory", dict(batch_size=[1, 2]),
        r"init_memory: batch_size must have shape \[\] \(a scalar\).*but got\] \[2\]"),
    "generate: temperature rank 1": (
        "generate", dict(prompt_ids=IDS, **MEMORY, **{**SAMPLING, "temperature": [1.0, 0.5]}),
        r"generate: temperature must have shape \[\] \(a scalar\).*but got\] \[2\]"),
    "generate_text: seed rank 1": (
        "generate_text", dict(prompt=np.array([b"a"]), **{**SAMPLING, "seed": [1, 2]}),
        r"generate_text: seed must have shape \[\] \(a scalar\).*but got\] \[2\]"),
    "encode_text: text rank 2": ("encode_text", dict(text=np.array([[b"ab", b"cd"]])),
                                 r"encode_text: text must have shape \[\] \(a scalar\).*"
                                 r"but got\] \[1 2\]"),
    "decode_ids: ids rank 2": ("decode_ids", dict(ids=[[65, 66], [67, 68]]),
                               r"decode_ids: ids must have shape \[G\].*but got\] \[2 2\]"),
    "decode_ids: id >= V": ("decode_ids", dict(ids=[65, 258]),
                            r"decode_ids: ids must be token ids in \[0, 258\)"),
    # A few bytes of request must not allocate [B, 2^30] int32 for the new tokens (8 GiB).
    "generate: max_new_tokens 2**30": (
        "generate", dict(prompt_ids=IDS, **MEMORY, **{**SAMPLING, "max_new_tokens": 2**30}),
        r"generate: B x max_new_tokens must be at most 536870912 tokens \(2 GiB of int32 ids\)"
        r".*but got B, max_new_tokens =\] \[2\] \[1073741824\]"),
    "generate_text: max_new_tokens 2**30": (
        "generate_text", dict(prompt=np.array([b"a"]), **{**SAMPLING, "max_new_tokens": 2**30}),
        r"generate_text: B x max_new_tokens must be at most 536870912 tokens"),
    # Non-finite memory would give NaN log-probs (score) or an id outside [0, V) (generate).
    "score: NaN keys": ("score", dict(token_ids=IDS, **{**MEMORY, **VALID_MEMORY,
                                                           "keys": NAN_KEYS}),
                        r"score: keys must be finite, but got\] \[1\] \[non-finite values\]"),
    "generate: Inf values": (
        "generate", dict(prompt_ids=IDS, **{**MEMORY, **VALID_MEMORY, "values": INF_VALUES},
                         **SAMPLING),
        r"generate: values must be finite, but got\] \[2\] \[non-finite values\]"),
}


@pytest.mark.parametrize("case", BAD_REQUESTS, ids=list(BAD_REQUESTS))
def test_bad_requests_fail_at_the_signature_entry_as_served(serving_session, case):
    """One InvalidArgumentError from the entry checks (an assert), naming the input, the expected
    and the received shape or values: not an error from an op deep inside the model."""
    assert_refused_at_the_entry(serving_session, *BAD_REQUESTS[case])


def test_generate_reads_a_long_prompt_in_segments_as_served(model, serving_session):
    """`generate` and `generate_text` read a prompt longer than memory + segment (60 > 24 + 6)
    in segments of the export's tgt_len on the memory, as score_document reads a document (a
    100,000-token prompt read as one segment needed a [1, 2, 100000, 100000] attention, 80 GB):
    the memory after the prompt is that of reading it segment by segment."""
    prompt = np.random.default_rng(6).integers(1, 256, (1, 60)).astype(np.int32)
    memory = model.init_key_value_memory(1, mem_len=MEM)
    want = memory
    for start in range(0, 60, T):
        _, want = model(prompt[:, start:start + T], want)
    out = serve(serving_session, "generate", prompt_ids=prompt,
                **{k: np.asarray(v) for k, v in memory.to_dict().items()},
                **{**SAMPLING, "max_new_tokens": np.int32(1)})
    np.testing.assert_allclose(out["keys"], np.stack([k.numpy() for k in want.keys], 1),
                               atol=1e-5)
    text = serve(serving_session, "generate_text", prompt=np.array([bytes(prompt[0].tolist())]),
                 **{**SAMPLING, "max_new_tokens": np.int32(4)})["text"]
    assert text.shape == (1,)


def test_the_prompt_bound_is_2_gib_of_request_tokens(model, monkeypatch):
    """`generate`/`generate_text` refuse B x P (P in whole segments) over the tokens whose
    working tensors fit 2 GiB, at the entry, as the classifier's signatures do (shown with
    the limit lowered to 12 tokens' worth)."""
    assert lm_signatures.Signatures(model).max_prompt_tokens == (
        2**31 // lm_signatures.PROMPT_TOKEN_BYTES)
    monkeypatch.setattr(signature_set, "MAX_MEMORY_BYTES", 12 * lm_signatures.PROMPT_TOKEN_BYTES)
    signatures = lm_signatures.Signatures(model)
    memory = model.init_key_value_memory(1, mem_len=MEM).to_dict()
    sampling = {k: tf.constant(v) for k, v in {**SAMPLING, "max_new_tokens": np.int32(1)}.items()}
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"generate: B x P, P rounded up to whole segments of T=6, must be "
                             r"at most 12 tokens .*but got B, P =\] \[1\] \[13\]"):
        signatures.functions["generate"](prompt_ids=tf.ones((1, 13), tf.int32), **memory,
                                         **sampling)


def test_good_requests_pass_the_served_checks(model, serving_session):
    out = serve(serving_session, "score", token_ids=IDS, **MEMORY)
    want, _ = model(IDS, model.init_key_value_memory(2, mem_len=MEM))
    np.testing.assert_allclose(out["log_probs"], want.numpy(), atol=1e-5)
    assert out["keys"].shape == (2, *KEYS_SHAPE)
    out = serve(serving_session, "score_document_masked", token_ids=IDS,
                target_mask=np.array([[1, 0], [0, 0]], np.float32))
    np.testing.assert_array_equal(out["tokens"], [1, 0])


def test_sampling_rules_are_shared_by_the_command_line():
    check_sampling(1, 0.0, 0, 1.0)
    for args, message in (((0, 1.0, 0, 1.0), "max_new_tokens must be >= 1, got 0"),
                          ((1, -0.5, 0, 1.0), "temperature must be >= 0"),
                          ((1, float("nan"), 0, 1.0), "temperature must be >= 0"),
                          ((1, 1.0, -1, 1.0), "top_k must be >= 0"),
                          ((1, 1.0, 0, 0.0), r"top_p must be in \(0, 1\]"),
                          ((1, 1.0, 0, 1.5), r"top_p must be in \(0, 1\]")):
        with pytest.raises(ValueError, match=message):
            check_sampling(*args)


@pytest.mark.large
def test_score_top_k_export_and_versions(model, exported, tmp_path, monkeypatch):
    base = os.path.dirname(exported)
    assert next_version(base) == 2
    with pytest.raises(ValueError, match="already exists"):
        export_saved_model(model, base, version=1)
    with pytest.raises(ValueError, match="tgt_len must be >= 1"):
        export_saved_model(model, str(tmp_path), tgt_len=0)
    # A loop's body runs once per trace: an export traces each loop once, however many
    # signatures run it (generate, generate_text; score_document, score_document_masked,
    # score_text), and the SavedModel holds it once.
    traced = []

    def counted(name):
        original = getattr(lm_signatures, name)

        def run(*args, **kwargs):
            traced.append(name)
            return original(*args, **kwargs)
        return run

    for name in ("generate", "score_document"):
        monkeypatch.setattr(lm_signatures, name, counted(name))
    path = export_saved_model(model, str(tmp_path), score_top_k=5, tokenizer=BytesTokenizer())
    assert sorted(traced) == ["generate", "score_document"]
    assert path.endswith(os.sep + "1")
    loaded = tf.saved_model.load(path).signatures
    assert {"generate_text", "score_text", "score_document_masked"} <= set(loaded)
    ids = np.array([[3, 4, 5]], np.int32)
    memory = model.init_key_value_memory(1, mem_len=MEM)
    out = loaded["score"](token_ids=tf.constant(ids), **memory.to_dict())
    full, _ = model(ids, memory)
    want = np.sort(full.numpy(), axis=-1)[..., ::-1][..., :5]
    np.testing.assert_allclose(out["top_log_probs"].numpy(), want, atol=1e-5)
    assert out["top_ids"].shape == (1, 3, 5)


def test_greedy_cached_generation_equals_full_recompute(model):
    prompt = np.array([[5, 6, 7, 8]], np.int32)
    ids, memory = generate(model, prompt, model.init_memory(1, mem_len=64), 10, temperature=0.0)
    sequence = list(prompt[0])
    for _ in range(10):  # vanilla: recompute the whole window for every new token
        log_probs, _ = model(np.array([sequence]), model.init_memory(1, mem_len=0))
        sequence.append(int(np.argmax(log_probs.numpy()[0, -1])))
    np.testing.assert_array_equal(ids.numpy()[0], sequence[4:])
    # The memory holds the prompt and all but the last generated token.
    assert int(memory.valid.numpy().sum()) == 4 + 10 - 1


@pytest.mark.large
def test_export_and_generate_command_lines(model, tmp_path):
    from tfxl.data.prepare import PrepareConfig, prepare
    text = tmp_path / "corpus.txt"
    text.write_text("def f(x):\n    return x\n" * 200)
    data_dir = tmp_path / "data"
    prepare(PrepareConfig(output_dir=str(data_dir), train=[str(text)], valid=[str(text)],
                          test=[str(text)], tokenizer="bytes", tgt_len=6, num_streams=2),
            log=lambda *a: None)
    model_dir = tmp_path / "model"
    (model_dir / "checkpoints").mkdir(parents=True)
    (model_dir / "config.json").write_text(json.dumps(model.config.to_dict()))
    tf.train.CheckpointManager(tf.train.Checkpoint(model=model),
                               str(model_dir / "checkpoints"), 1).save()

    exports = tmp_path / "exports"
    first = run_in_process("tfxl.serving.export_main", f"--model={model_dir}",
                           f"--data_dir={data_dir}", f"--output_dir={exports}", "--tgt_len=4",
                           "--score_top_k=3")
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.strip().endswith(os.path.join("exports", "1"))
    signatures = tf.saved_model.load(str(exports / "1")).signatures
    ids = np.random.default_rng(2).integers(0, 256, (1, 11))
    got = signatures["score_document"](token_ids=tf.constant(ids, tf.int32))["nll"].numpy()
    np.testing.assert_allclose(got, reference_nll(model, ids, tgt_len=4), atol=1e-5)
    scored = signatures["score"](token_ids=tf.constant(ids, tf.int32),
                                 **model.init_key_value_memory(1, mem_len=MEM).to_dict())
    assert scored["top_ids"].shape == (1, 11, 3)
    again = run_in_process("tfxl.serving.export_main", f"--model={model_dir}",
                           f"--output_dir={exports}", "--version=1")
    assert again.returncode == 2 and "already exists" in again.stderr
    missing = run_in_process("tfxl.serving.export_main", f"--model={tmp_path / 'nope'}",
                             f"--output_dir={exports}")
    assert missing.returncode == 2 and "config.json" in missing.stderr
    negative = run_in_process("tfxl.serving.export_main", f"--model={model_dir}",
                              f"--output_dir={exports}", "--version=-1")
    assert negative.returncode == 2 and "--version must be a positive integer" in negative.stderr
    assert sorted(os.listdir(exports)) == ["1"]

    flags = [f"--data_dir={data_dir}", "--prompt=def f(", "--max_new_tokens=12",
             "--temperature=0.9", "--top_k=50", "--seed=2148"]  # seed * 1_000_003 > 2**31
    from_checkpoint = run_in_process("tfxl.serving.generate_main", f"--model={model_dir}", *flags)
    from_export = run_in_process("tfxl.serving.generate_main", f"--model={exports / '1'}", *flags)
    assert from_checkpoint.returncode == 0, from_checkpoint.stderr[-2000:]
    assert from_export.returncode == 0, from_export.stderr[-2000:]
    assert from_checkpoint.stdout == from_export.stdout  # same seed, same text, either backend
    # ... and TransfoXLLM.generate's tokens for that seed (one call, not one per token).
    want = model.generate(BytesTokenizer().encode("def f("), 12, temperature=0.9, top_k=50,
                          seed=2148)
    assert from_checkpoint.stdout == BytesTokenizer().decode(want) + "\n"
    assert len(from_checkpoint.stdout) > 1
    bad = run_in_process("tfxl.serving.generate_main", f"--model={model_dir}", *flags,
                         "--prompt_file=x")
    assert bad.returncode == 2 and "exactly one" in bad.stderr
    bad = run_in_process("tfxl.serving.generate_main", f"--model={model_dir}", flags[0],
                         f"--prompt_file={tmp_path / 'none.txt'}")
    assert bad.returncode == 2 and "--prompt_file" in bad.stderr and "none.txt" in bad.stderr
    bad = run_in_process("tfxl.serving.generate_main", f"--model={model_dir}", *flags, "--top_p=0")
    assert bad.returncode == 2 and "top_p must be in (0, 1]" in bad.stderr


def test_generate_from_a_model_traces_its_one_token_step_once(model):
    """tfxl-generate from a model: the prompt's call and each later token's run one trace."""
    from tfxl.serving.generate_main import _ModelStepper
    step = _ModelStepper(model, None)
    first = step(np.array([[3, 1, 4]], np.int32), 1.0, 0, 1.0, 0)
    second = step(first.numpy(), 1.0, 0, 1.0, 1)
    assert first.shape == second.shape == (1, 1)
    assert step._generate.experimental_get_tracing_count() == 1


def test_generate_reads_a_long_prompt_in_segments_on_the_memory(model):
    """tfxl-generate's first call reads a prompt longer than memory + segment (60 > 24 + 6) in
    segments of the eval tgt_len: its memory after the prompt is that of reading the prompt
    segment by segment (a P x P attention, 180k x 180k for a 180 KB prompt, is never built)."""
    from tfxl.serving.generate_main import _ModelStepper
    prompt = np.random.default_rng(4).integers(0, 258, (1, 60)).astype(np.int32)
    step = _ModelStepper(model, None)
    step(prompt, 1.0, 0, 1.0, 0)
    want = model.init_key_value_memory(1, mem_len=MEM)
    for start in range(0, 60, T):
        _, want = model(prompt[:, start:start + T], want)
    for got, expected in zip(step.memory.keys, want.keys):
        np.testing.assert_allclose(got.numpy(), expected.numpy(), atol=1e-5)


def test_generate_bounds_its_sizes_before_building_anything(model, tmp_path):
    """--mem_len, --max_new_tokens and --prompt_file are bounded, the flag named: a memory of
    10^9 slots or a 1 GiB prompt file is one error line, not an out-of-memory error or a
    1 GiB read (the file's size is read, not the file)."""
    path = tmp_path / "tiny.keras"
    model.save(path)
    flags = [f"--model={path}", f"--data_dir={tmp_path / 'never_read'}"]
    huge = run_in_process("tfxl.serving.generate_main", *flags, "--prompt=a",
                          "--mem_len=1000000000")
    assert huge.returncode == 2, huge.stderr[-2000:]
    line = huge.stderr.splitlines()[-1]
    assert line.startswith("error: --mem_len=1000000000: a key/value memory of 1000000000 slots")
    assert "GiB" in line and "slots fit in 2.0 GiB" in line
    many = run_in_process("tfxl.serving.generate_main", *flags, "--prompt=a",
                          "--max_new_tokens=2000000000")
    assert many.returncode == 2
    assert many.stderr.splitlines()[-1].startswith(
        "error: --max_new_tokens=2000000000: at most 536870912 new tokens")
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.truncate(2**30)  # sparse: 1 GiB of zero bytes, valid UTF-8
    refused = run_in_process("tfxl.serving.generate_main", *flags, f"--prompt_file={big}")
    assert refused.returncode == 2
    assert refused.stderr.splitlines()[-1] == (
        f"error: --prompt_file={big} holds 1073741824 bytes; a prompt may hold at most "
        "16777216 bytes (16 MiB)")


@pytest.mark.large
@pytest.mark.subprocess
def test_generate_names_a_prompt_or_seed_it_cannot_use(tmp_path):
    """Refused before any model is loaded: a --prompt of bytes that are not UTF-8 (Python sees
    surrogate escapes, which no encoder takes) and a --seed outside int32 (the signatures' type)."""
    model = f"--model={tmp_path / 'never_read'}"
    bad = subprocess.run([sys.executable, "-m", "tfxl.serving.generate_main", model,
                          b"--prompt=caf\xe9 \xff"], capture_output=True, timeout=300)
    assert bad.returncode == 2, bad.stderr[-2000:]
    assert bad.stderr.decode().splitlines()[-1] == (
        "error: --prompt is not UTF-8 text: byte 0xe9 at offset 3 (invalid continuation byte); "
        "the tokenizers read UTF-8")
    for seed in (2**31, -2**31 - 1):
        bad = run_in_process("tfxl.serving.generate_main", model, "--prompt=a", f"--seed={seed}")
        assert bad.returncode == 2 and "--seed" in bad.stderr.splitlines()[-1], bad.stderr


def test_readme_rest_requests_match_the_signatures(exported):
    """Every JSON request body in docs/serving.md calls its signature with exactly those inputs;
    KEYS, VALUES and VALID stand for the memory arrays of the preceding init_memory response."""
    readme = open(os.path.join(HERE, os.pardir, "docs", "serving.md")).read()
    bodies = re.findall(r"```json\n(.*?)\n```", readme, re.S)
    placeholders = ("KEYS", "VALUES", "VALID")
    names = set()
    for body in bodies:
        for placeholder in placeholders:
            body = body.replace(placeholder, "0")
        names.add(json.loads(body)["signature_name"])
    assert names >= {"init_memory", "score", "generate_text", "score_document", "score_text"}
    signatures = tf.saved_model.load(exported).signatures
    memory = None
    for body in bodies:
        if memory is not None:
            for placeholder in placeholders:
                body = body.replace(placeholder,
                                    json.dumps(memory[placeholder.lower()].numpy().tolist()))
        request = json.loads(body)
        fn = signatures[request["signature_name"]]
        _, specs = fn.structured_input_signature
        assert set(request["inputs"]) == set(specs), request["signature_name"]
        args = {k: tf.constant(v, dtype=specs[k].dtype) for k, v in request["inputs"].items()}
        result = fn(**args)
        if request["signature_name"] == "init_memory":
            memory = result


def test_top_p_at_or_below_zero_is_greedy_not_uniform():
    log_probs = tf.math.log(tf.constant([[0.1, 0.6, 0.2, 0.1]] * 128))
    for p in (0.0, -1.0, 1e-6):
        picked = sample_next(log_probs, 1.0, 0, p, tf.constant([1, 2])).numpy()
        assert set(picked) == {1}, p


# ------------------------------------------------------------------- publishing an export whole
def as_object_store(monkeypatch, tmp_path):
    """Makes tfxl treat every path as an object store (no atomic directory rename), staging in
    tmp_path/staging; returns the list of every tf.io.gfile.copy destination, in order."""
    import tempfile
    import tfxl.files
    monkeypatch.setattr(tfxl.files, "is_local", lambda path: False)
    (tmp_path / "staging").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "staging"))
    copied, copy = [], tf.io.gfile.copy

    def recording_copy(source, target, overwrite=False):
        copy(source, target, overwrite)
        copied.append(os.fspath(target))
    monkeypatch.setattr(tf.io.gfile, "copy", recording_copy)
    return copied


def left_in_staging(tmp_path):
    """What the export left in the staging directory, less the modules AutoGraph writes to the
    temporary directory when the export is the first to trace a function (not the export's)."""
    return [name for name in os.listdir(tmp_path / "staging")
            if not name.startswith("__autograph_generated_file")]


def test_object_store_export_copies_saved_model_pb_last(model, tmp_path, monkeypatch, traced_once):
    copied = as_object_store(monkeypatch, tmp_path)
    renamed, rename = [], tf.io.gfile.rename
    monkeypatch.setattr(tf.io.gfile, "rename",
                        lambda *a, **k: renamed.append(a[1]) or rename(*a, **k))
    base = tmp_path / "exports"
    # The `exported` fixture's arguments: its traced signatures (trace_once).
    path = export_saved_model(model, str(base), score_top_k=0, tokenizer=BytesTokenizer())
    assert path == str(base / "1")
    assert not [r for r in renamed if r.startswith(str(base))]  # no rename into the base
    assert copied[-1] == os.path.join(path, "saved_model.pb")
    assert os.path.join(path, "variables", "variables.index") in copied
    assert os.path.join(path, "assets.extra", "tfxl_data.json") in copied
    assert sorted(os.listdir(base)) == ["1"]  # staged elsewhere: nothing else in the base
    assert left_in_staging(tmp_path) == []  # and removed there
    ids = np.array([[3, 4, 5]], np.int32)
    memory = model.init_key_value_memory(1, mem_len=MEM)
    got = tf.saved_model.load(path).signatures["score"](token_ids=tf.constant(ids),
                                                        **memory.to_dict())
    np.testing.assert_allclose(got["log_probs"].numpy(), model(ids, memory)[0].numpy(),
                               atol=1e-5)


@pytest.mark.large
def test_object_store_export_failing_midway_leaves_no_version(model, tmp_path, monkeypatch,
                                                              traced_once):
    copied = as_object_store(monkeypatch, tmp_path)
    copy = tf.io.gfile.copy

    def failing_copy(source, target, overwrite=False):
        if len(copied) == 2:
            raise tf.errors.UnavailableError(None, None, "connection reset")
        copy(source, target, overwrite)
    monkeypatch.setattr(tf.io.gfile, "copy", failing_copy)
    base = tmp_path / "exports"
    with pytest.raises(tf.errors.UnavailableError):  # (`exported`'s arguments: one trace)
        export_saved_model(model, str(base), score_top_k=0, tokenizer=BytesTokenizer())
    assert len(copied) == 2 and not any(c.endswith("saved_model.pb") for c in copied)
    assert not (base / "1").exists() and os.listdir(base) == []  # the partial version is gone
    assert left_in_staging(tmp_path) == []
    assert next_version(str(base)) == 1
    monkeypatch.setattr(tf.io.gfile, "copy", copy)
    assert export_saved_model(model, str(base)) == str(base / "1")
    assert tf.io.gfile.exists(str(base / "1" / "saved_model.pb"))


@pytest.mark.large
def test_local_export_is_built_aside_and_renamed_into_place(model, tmp_path, monkeypatch,
                                                            traced_once):
    base = tmp_path / "exports"
    seen, write = [], publish.write_signatures

    def watching_write(signatures, path, *args, **kwargs):
        seen.append((os.path.basename(path), os.path.dirname(path), (base / "1").exists()))
        write(signatures, path, *args, **kwargs)
        raise OSError("disk full")
    monkeypatch.setattr(publish, "write_signatures", watching_write)
    with pytest.raises(OSError, match="disk full"):
        export_saved_model(model, str(base))
    name, parent, published = seen[0]
    assert name.startswith(".tmp-export-1-") and parent == str(base)  # beside the version,
    assert not published                                                 # which is not there
    assert os.listdir(base) == []  # the temporary directory is removed on failure
    monkeypatch.setattr(publish, "write_signatures", write)
    renamed, rename = [], tf.io.gfile.rename
    monkeypatch.setattr(tf.io.gfile, "rename",
                        lambda *a, **k: renamed.append(a[1]) or rename(*a, **k))
    (base / ".tmp-export-7-0a1b2c3d").mkdir()  # another export's temporary: not a version
    assert next_version(str(base)) == 1
    path = export_saved_model(model, str(base))
    assert path == str(base / "1") and renamed[-1] == path  # one rename publishes it
    assert [r for r in renamed if ".tmp-export" not in r] == [path]
    assert sorted(os.listdir(base)) == [".tmp-export-7-0a1b2c3d", "1"]


# An export that, once its version is written under the temporary name, marks a file and waits
# to be killed: `python -c HANG_BEFORE_PUBLISH TESTS_DIR OUTPUT_DIR MARKER`.
HANG_BEFORE_PUBLISH = """
import sys, time
tests, output_dir, marker = sys.argv[1:4]
sys.path.insert(0, tests)
import tfxl.saved_model.publish as publish
from factories import tiny_lm
from tfxl.models.signatures import export_saved_model
write = publish.write_signatures

def hang(*args, **kwargs):  # the export is complete, not yet published
    write(*args, **kwargs)
    open(marker, "w").close()
    time.sleep(600)

publish.write_signatures = hang
export_saved_model(tiny_lm(), output_dir)
"""


@pytest.mark.large
@pytest.mark.subprocess
def test_export_killed_before_publishing_leaves_no_version(model, tmp_path, traced_once):
    """kill -9 of an export leaves only its ".tmp-export-1-..." directory, which neither TF
    Serving (integer names only) nor the next export (then version 1, not 2) takes for a version."""
    import time
    base, marker = tmp_path / "exports", tmp_path / "written"
    proc = subprocess.Popen([sys.executable, "-c", HANG_BEFORE_PUBLISH, HERE, str(base),
                             str(marker)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert marker.exists(), proc.stderr.read()[-2000:] if proc.poll() is not None else "timeout"
    proc.kill()  # SIGKILL
    proc.wait()
    proc.stderr.close()
    left = os.listdir(base)
    assert len(left) == 1 and left[0].startswith(".tmp-export-1-"), left
    assert next_version(str(base)) == 1
    assert export_saved_model(model, str(base)) == str(base / "1")
    assert "score" in tf.saved_model.load(str(base / "1")).signatures


def test_versions_are_positive_integers_and_never_overwritten(model, tmp_path):
    base = tmp_path / "exports"
    for version in (0, -1, True, 1.5, "2"):
        with pytest.raises(ValueError, match="--version must be a positive integer"):
            export_saved_model(model, str(base), version=version)
    assert not base.exists()
    (base / "3" / "variables").mkdir(parents=True)  # an object-store publish killed midway
    with pytest.raises(ValueError, match="without saved_model.pb .* delete it to reuse"):
        export_saved_model(model, str(base), version=3)
    assert next_version(str(base)) == 4  # TF Serving may have seen 3: never reused


@pytest.mark.large
def test_export_to_a_remote_file_system_goes_through_gfile(model, tmp_path, monkeypatch,
                                                           traced_once):
    """ram:// (TensorFlow's in-memory file system) stands for a bucket: the export is uploaded
    there and loads from there, and no local folder named like it appears."""
    monkeypatch.chdir(tmp_path)
    path = export_saved_model(model, "ram://serving-test/exports", score_top_k=0,
                              tokenizer=BytesTokenizer())
    assert path == "ram://serving-test/exports/1"
    signatures = tf.saved_model.load(path).signatures
    assert "generate_text" in signatures
    from tfxl.model_dir import export_vocab_size
    assert export_vocab_size(path) == 258
    model.export("ram://serving-test/model_export", verbose=False)
    assert "score" in tf.saved_model.load("ram://serving-test/model_export").signatures
    assert os.listdir(tmp_path) == []


def test_model_export_is_published_whole(model, tmp_path, monkeypatch, traced_once):
    copied = as_object_store(monkeypatch, tmp_path)
    target = tmp_path / "empty"
    target.mkdir()  # an empty directory may be exported into (as before)
    model.export(str(target), verbose=False)
    assert copied[-1] == str(target / "saved_model.pb")
    assert sorted(os.listdir(tmp_path)) == ["empty", "staging"]
    with pytest.raises(ValueError, match="never overwritten"):
        model.export(str(target), verbose=False)


def test_models_prompts_and_records_in_a_bucket_are_read_through_gfile(model, tmp_path,
                                                                       monkeypatch, traced_once):
    """--model as a .keras file, a model_dir or an export in a bucket (ram:// stands for one),
    --prompt_file there, and the vocabulary check of such a model_dir; no local folder named
    like the bucket appears."""
    from tfxl.data.prepare import PrepareConfig, prepare
    from tfxl.serving.generate_main import read_prompt
    from tfxl.checkpoints.loading import (EXPORT, KERAS, MODEL_DIR, load_checked_tokenizer,
                                     load_language_model, model_kind)
    monkeypatch.chdir(tmp_path)
    bucket = "ram://serving-load"

    def same_weights(loaded):
        for mine, theirs in zip(loaded.get_weights(), model.get_weights()):
            np.testing.assert_array_equal(mine, theirs)

    model.save(f"{bucket}/lm.keras")
    assert model_kind(f"{bucket}/lm.keras") == KERAS
    same_weights(load_language_model(f"{bucket}/lm.keras"))
    with pytest.raises(ValueError, match="no such .keras file"):
        load_language_model(f"{bucket}/other.keras")

    run = f"{bucket}/run"
    with tf.io.gfile.GFile(f"{run}/config.json", "w") as f:
        f.write(json.dumps(model.config.to_dict()))
    # (Its checkpoints are not restored from ram://: that file system calls every prefix of a
    # name a directory, so tf.train.load_checkpoint takes ckpt-1 for a directory; GCS does not.)
    assert model_kind(run) == MODEL_DIR

    exported = export_saved_model(model, f"{bucket}/exports")
    assert model_kind(exported) == EXPORT
    with pytest.raises(ValueError, match="exported SavedModel"):
        load_language_model(exported)
    (tmp_path / "half" / "variables").mkdir(parents=True)  # an upload that was interrupted
    with pytest.raises(ValueError, match="without saved_model.pb"):
        model_kind(str(tmp_path / "half"))

    with tf.io.gfile.GFile(f"{bucket}/prompt.txt", "wb") as f:
        f.write("naïve prompt\n".encode())
    assert read_prompt(f"{bucket}/prompt.txt") == "naïve prompt\n"
    with pytest.raises(ValueError, match=f"--prompt_file={bucket}/none.txt: cannot read"):
        read_prompt(f"{bucket}/none.txt")

    (tmp_path / "corpus.txt").write_text("def f(x):\n    return x\n" * 50)
    data_dir = str(tmp_path / "data")
    corpus = [str(tmp_path / "corpus.txt")]
    prepare(PrepareConfig(output_dir=data_dir, train=corpus, valid=corpus, test=corpus,
                          tokenizer="bytes", tgt_len=6, num_streams=1), log=lambda *a: None)
    assert load_checked_tokenizer(data_dir, run, 258).vocab_size == 258  # nothing recorded
    with tf.io.gfile.GFile(f"{run}/data.json", "w") as f:
        f.write(json.dumps({"vocab_sha256": "0" * 64, "vocab_size": 258, "data_dir": "other"}))
    with pytest.raises(ValueError, match="has another vocabulary"):
        load_checked_tokenizer(data_dir, run, 258)
    assert sorted(os.listdir(tmp_path)) == ["corpus.txt", "data", "half"]


def test_a_model_that_has_generated_exports(model, tmp_path, traced_once):
    """TransfoXLLM.generate caches its compiled loops on the model; a cache Keras/TensorFlow
    tracked (a dict keyed by memory length) made every later export of the model fail
    ('Unable to save the object {24: <Function>}'). Keras 3.15's `export` no longer walks that
    dict; TensorFlow's `tf.saved_model.save` of the model's objects still does (without the fix
    this test fails there): both are checked. The file's model, with its signatures traced once
    (trace_once): the failure is in saving the model's objects, which every export does."""
    model.generate(np.ones((1, 2), np.int32), 2)
    assert model._generate_loops  # a compiled loop is cached on the model
    model.export(str(tmp_path / "1"), verbose=False)
    tf.saved_model.save(model, str(tmp_path / "2"), signatures={})
    for version in ("1", "2"):
        assert (tmp_path / version / "saved_model.pb").exists()
