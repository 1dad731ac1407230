"""SavedModel export, signatures from a TensorFlow-only process, generation and sampling."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tfxl import TransfoXLConfig, TransfoXLLM
from tfxl.data.tokenizers import BytesTokenizer
from tfxl.serving.export import export_saved_model, next_version
from tfxl.models.generation import generate
from tfxl.models.sampling import sample_next

HERE = os.path.dirname(__file__)
MEM = 24


@pytest.fixture(scope="module")
def model():
    config = TransfoXLConfig(vocab_size=258, n_layer=2, d_model=32, n_head=2, d_head=16,
                             d_inner=64, dropout=0.0, tgt_len=6, mem_len=6, eval_mem_len=MEM,
                             init_std=0.1)
    lm = TransfoXLLM(config)
    lm.build((None, 6))
    return lm


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory):
    base = str(tmp_path_factory.mktemp("export"))
    return export_saved_model(model, base, top_k=0, tokenizer=BytesTokenizer())


def test_tensorflow_only_client_matches_the_python_model(model, exported, tmp_path):
    rng = np.random.default_rng(0)
    document = rng.integers(0, 256, (2, 18)).astype(np.int32)
    prompt = rng.integers(0, 256, (2, 4)).astype(np.int32)
    np.savez(tmp_path / "in.npz", document=document, prompt=prompt)
    result = subprocess.run(
        [sys.executable, os.path.join(HERE, "serving_client.py"), exported,
         str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
        capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    out = np.load(tmp_path / "out.npz", allow_pickle=False)
    assert not out["tfxl_imported"]
    assert not out["init_valid"].any() and out["init_states"].shape == (2, 2, MEM, 32)
    # Streaming through three requests equals one long evaluation (memory >= document).
    full, _ = model(document, model.init_memory(2, mem_len=0))
    np.testing.assert_allclose(out["streamed_log_probs"], full.numpy(), atol=1e-5)
    ids, _ = generate(model, prompt, model.init_memory(2, mem_len=MEM), 7, 0.8, 20, 0.9, 5)
    np.testing.assert_array_equal(out["generated_ids"], ids.numpy())
    # generate_text left-pads the shorter prompt and masks the padding.
    tokenizer = BytesTokenizer()
    first, second = tokenizer.encode("def f("), tokenizer.encode("import os")
    padded = np.stack([np.concatenate([np.zeros(3, np.int32), first]), second])
    valid = np.ones(padded.shape, bool)
    valid[0, :3] = False
    ids, _ = generate(model, padded, model.init_memory(2, mem_len=MEM), 7, 0.8, 20, 0.9, 5,
                      prompt_valid=valid)
    np.testing.assert_array_equal(out["text"], tokenizer.tf_decode(ids).numpy().astype("S"))


def test_saved_model_cli_lists_every_signature(exported):
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    shown = subprocess.run([cli, "show", "--dir", exported, "--all"], capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr[-2000:]
    for name in ("serving_default", "score", "init_memory", "generate", "generate_text"):
        assert f"signature_def['{name}']" in shown.stdout


def test_bad_requests_fail_with_a_message(exported):
    score = tf.saved_model.load(exported).signatures["score"]
    states = tf.zeros((2, 2, MEM, 32))
    valid = tf.zeros((2, MEM), tf.bool)
    with pytest.raises(tf.errors.InvalidArgumentError, match="vocab_size 258"):
        score(token_ids=tf.constant([[1, 300]] * 2), states=states, valid=valid)
    with pytest.raises(tf.errors.InvalidArgumentError, match="token id < 0"):
        score(token_ids=tf.constant([[1, -1]] * 2), states=states, valid=valid)
    with pytest.raises(tf.errors.InvalidArgumentError, match="states batch"):
        score(token_ids=tf.constant([[1, 2]] * 3), states=states, valid=valid)
    with pytest.raises((TypeError, ValueError, tf.errors.InvalidArgumentError),
                       match="int32"):
        score(token_ids=tf.constant([[1.0, 2.0]] * 2), states=states, valid=valid)
    with pytest.raises((TypeError, ValueError, tf.errors.InvalidArgumentError)):  # wrong M
        score(token_ids=tf.constant([[1, 2]] * 2), states=tf.zeros((2, 2, 5, 32)),
              valid=tf.zeros((2, 5), tf.bool))


def test_top_k_export_and_versions(model, exported, tmp_path):
    base = os.path.dirname(exported)
    assert next_version(base) == 2
    with pytest.raises(ValueError, match="already exists"):
        export_saved_model(model, base, version=1)
    path = export_saved_model(model, str(tmp_path), top_k=5)
    assert path.endswith(os.sep + "1")
    loaded = tf.saved_model.load(path).signatures["score"]
    ids = np.array([[3, 4, 5]], np.int32)
    out = loaded(token_ids=tf.constant(ids), states=tf.zeros((1, 2, MEM, 32)),
                 valid=tf.zeros((1, MEM), tf.bool))
    full, _ = model(ids, model.init_memory(1, mem_len=MEM))
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
    assert int(memory["valid"].numpy().sum()) == 4 + 10 - 1


def test_sampling_filters_and_seeds():
    log_probs = tf.math.log(tf.constant([[0.5, 0.3, 0.15, 0.05]] * 256))
    greedy = sample_next(log_probs, 0.0, 0, 1.0, tf.constant([1, 2]))
    assert set(greedy.numpy()) == {0}
    assert set(sample_next(log_probs, 1.0, 1, 1.0, tf.constant([1, 2])).numpy()) == {0}
    top2 = sample_next(log_probs, 1.0, 2, 1.0, tf.constant([1, 2])).numpy()
    assert set(top2) == {0, 1}
    nucleus = sample_next(log_probs, 1.0, 0, 0.7, tf.constant([1, 2])).numpy()
    assert set(nucleus) == {0, 1}  # 0.5 < 0.7 needs the second token, not the third
    everything = sample_next(log_probs, 1.0, 0, 1.0, tf.constant([3, 4])).numpy()
    assert set(everything) == {0, 1, 2, 3}
    again = sample_next(log_probs, 1.0, 0, 1.0, tf.constant([3, 4])).numpy()
    np.testing.assert_array_equal(everything, again)


def run_cli(module, *args):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          timeout=300)


def test_export_and_generate_command_lines(model, tmp_path):
    import json

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
    first = run_cli("tfxl.serving.export_main", f"--model={model_dir}",
                    f"--data_dir={data_dir}", f"--output_dir={exports}")
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.strip().endswith(os.path.join("exports", "1"))
    again = run_cli("tfxl.serving.export_main", f"--model={model_dir}",
                    f"--output_dir={exports}", "--version=1")
    assert again.returncode == 2 and "already exists" in again.stderr
    missing = run_cli("tfxl.serving.export_main", f"--model={tmp_path / 'nope'}",
                      f"--output_dir={exports}")
    assert missing.returncode == 2 and "config.json" in missing.stderr

    flags = [f"--data_dir={data_dir}", "--prompt=def f(", "--max_new_tokens=12",
             "--temperature=0.9", "--top_k=50", "--seed=7"]
    from_checkpoint = run_cli("tfxl.serving.generate_main", f"--model={model_dir}", *flags)
    from_export = run_cli("tfxl.serving.generate_main", f"--model={exports / '1'}", *flags)
    assert from_checkpoint.returncode == 0, from_checkpoint.stderr[-2000:]
    assert from_export.returncode == 0, from_export.stderr[-2000:]
    assert from_checkpoint.stdout == from_export.stdout  # same seed, same text, either backend
    assert len(from_checkpoint.stdout) > 1
    bad = run_cli("tfxl.serving.generate_main", f"--model={model_dir}", *flags,
                  "--prompt_file=x")
    assert bad.returncode == 2 and "exactly one" in bad.stderr


def test_readme_rest_requests_match_the_signatures(exported):
    """Every JSON request body in the README calls its signature with exactly those inputs."""
    import json
    import re

    readme = open(os.path.join(HERE, os.pardir, "README.md")).read()
    bodies = re.findall(r"```json\n(.*?)\n```", readme, re.S)
    assert {json.loads(b.replace("STATES", "0").replace("VALID", "0"))["signature_name"]
            for b in bodies} >= {"init_memory", "score", "generate_text"}
    signatures = tf.saved_model.load(exported).signatures
    memory = None
    for body in bodies:
        if memory is not None:
            body = body.replace("STATES", json.dumps(memory["states"].numpy().tolist()))
            body = body.replace("VALID", json.dumps(memory["valid"].numpy().tolist()))
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
