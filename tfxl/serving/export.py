"""SavedModel export for TF Serving (Keras ExportArchive), stateless: memory goes in and out.

Shape glossary: B batch, T segment length, P prompt length, N new tokens, L layers, M memory
length (fixed at export), D model size, V vocabulary size, K top-k size.

Signatures (all batch-major; every request carries its own memory, so concurrent requests never
share state):
  score (= serving_default): token_ids int32 [B, T], states float32 [B, L, M, D], valid bool [B, M]
      -> log_probs float32 [B, T, V] (export with top_k=0) or top_ids int32 [B, T, K] and
         top_log_probs float32 [B, T, K]; plus the new states and valid.
  init_memory: batch_size int32 [] -> states, valid (an empty memory).
  generate: prompt_ids int32 [B, P], states, valid, max_new_tokens int32 [], temperature
      float32 [], top_k int32 [], top_p float32 [], seed int32 [] -> generated_ids int32 [B, N],
      states, valid. One token per tf.while_loop step on cached memory. The returned memory
      holds everything but the last generated token: continue by sending generated_ids[:, -1:]
      as the next prompt (streaming one token per call).
  generate_text (when a tokenizer is given): prompt string [B], max_new_tokens, temperature,
      top_k, top_p, seed -> text string [B] (the continuation). Prompts of different lengths are
      left-padded and the padding masked.
Bad requests (batch mismatch, ids outside [0, V)) fail with a message saying what is wrong.
"""

import os

import keras
import tensorflow as tf

from tfxl.layers.memory import STATES, VALID
from tfxl.models.generation import generate

def next_version(output_dir):
    """1 + the largest integer version directory under `output_dir` (1 when there is none)."""
    if not tf.io.gfile.isdir(output_dir):
        return 1
    versions = [int(name.strip("/")) for name in tf.io.gfile.listdir(output_dir)
                if name.strip("/").isdigit()]
    return max(versions, default=0) + 1


def _check_ids(ids, vocab_size, what):
    ids = tf.convert_to_tensor(ids)
    checks = [tf.debugging.assert_non_negative(ids, message=f"{what}: token id < 0"),
              tf.debugging.assert_less(ids, tf.cast(vocab_size, ids.dtype),
                                       message=f"{what}: token id >= vocab_size {vocab_size}")]
    with tf.control_dependencies(checks):
        return tf.identity(ids)


def _check_batch(ids, states, valid, what):
    batch = tf.shape(ids)[0]
    checks = [tf.debugging.assert_equal(tf.shape(states)[0], batch, message=(
                  f"{what}: states batch differs from the token batch")),
              tf.debugging.assert_equal(tf.shape(valid)[0], batch, message=(
                  f"{what}: valid batch differs from the token batch"))]
    with tf.control_dependencies(checks):
        return tf.identity(ids)


def export_saved_model(model, output_dir, version=None, mem_len=None, clamp_len=None,
                       same_length=None, top_k=16, tokenizer=None):
    """Writes `<output_dir>/<version>/saved_model.pb` with the signatures above; returns its path.

    mem_len/clamp_len/same_length default to the config's evaluation settings. An existing
    version directory is never overwritten.
    """
    c = model.config
    settings = c.eval_settings()
    mem_len = settings["mem_len"] if mem_len is None else int(mem_len)
    clamp_len = settings["clamp_len"] if clamp_len is None else int(clamp_len)
    same_length = settings["same_length"] if same_length is None else bool(same_length)
    if tf.io.gfile.exists(output_dir) and not tf.io.gfile.isdir(output_dir):
        raise ValueError(f"--output_dir={output_dir} is a file, not a directory")
    version = next_version(output_dir) if version is None else int(version)
    path = os.path.join(output_dir, str(version))
    if tf.io.gfile.exists(path):
        raise ValueError(f"{path} already exists; exports are never overwritten (pick another "
                         "--version)")
    vocab, top_k = c.vocab_size, int(top_k)
    states_spec = tf.TensorSpec([None, c.n_layer, mem_len, c.d_model], tf.float32, name="states")
    valid_spec = tf.TensorSpec([None, mem_len], tf.bool, name="valid")
    scalar = lambda dtype, name: tf.TensorSpec([], dtype, name=name)  # noqa: E731
    sampling_specs = [scalar(tf.int32, "max_new_tokens"), scalar(tf.float32, "temperature"),
                      scalar(tf.int32, "top_k"), scalar(tf.float32, "top_p"),
                      scalar(tf.int32, "seed")]
    run = dict(clamp_len=clamp_len, same_length=same_length)

    def memory_out(memory):
        return {"states": tf.cast(memory[STATES], tf.float32), "valid": memory[VALID]}

    def score(token_ids, states, valid):
        token_ids = _check_batch(_check_ids(token_ids, vocab, "score"), states, valid, "score")
        log_probs, memory = model(token_ids, {STATES: states, VALID: valid}, **run)
        out = memory_out(memory)
        if top_k <= 0:
            out["log_probs"] = log_probs
        else:
            best = tf.math.top_k(log_probs, k=min(top_k, vocab))
            out["top_ids"], out["top_log_probs"] = best.indices, best.values
        return out

    def init_memory(batch_size):
        tf.debugging.assert_positive(batch_size, message="init_memory: batch_size must be > 0")
        return memory_out(model.init_memory(batch_size, mem_len=mem_len, dtype="float32"))

    def generate_ids(prompt_ids, states, valid, max_new_tokens, temperature, top_k_, top_p, seed):
        prompt_ids = _check_batch(_check_ids(prompt_ids, vocab, "generate"), states, valid,
                                  "generate")
        ids, memory = generate(model, prompt_ids, {STATES: states, VALID: valid},
                               max_new_tokens, temperature, top_k_, top_p, seed, **run)
        return {"generated_ids": ids, **memory_out(memory)}

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("score", score, [tf.TensorSpec([None, None], tf.int32, "token_ids"),
                                          states_spec, valid_spec])
    archive.add_endpoint("init_memory", init_memory, [scalar(tf.int32, "batch_size")])
    archive.add_endpoint("generate", generate_ids,
                         [tf.TensorSpec([None, None], tf.int32, "prompt_ids"), states_spec,
                          valid_spec, *sampling_specs])
    if tokenizer is not None:
        if tokenizer.vocab_size != vocab:
            raise ValueError(f"tokenizer vocab_size {tokenizer.vocab_size} != model vocab_size "
                             f"{vocab}")
        archive.track(tokenizer)

        def generate_text(prompt, max_new_tokens, temperature, top_k_, top_p, seed):
            ragged = tokenizer.tf_encode(prompt)  # [B, None]
            lengths = ragged.row_lengths()
            tf.debugging.assert_positive(lengths, message="generate_text: empty prompt")
            # Left-pad to a rectangle: the last column is every prompt's last token.
            padded = tf.reverse(tf.reverse(ragged, axis=[1]).to_tensor(0), axis=[1])
            prompt_valid = tf.sequence_mask(lengths, tf.shape(padded)[1])[:, ::-1]
            batch = tf.shape(padded)[0]
            memory = model.init_memory(batch, mem_len=mem_len, dtype="float32")
            ids, _ = generate(model, padded, memory, max_new_tokens, temperature, top_k_, top_p,
                              seed, prompt_valid=prompt_valid, **run)
            return {"text": tokenizer.tf_decode(ids)}

        archive.add_endpoint("generate_text", generate_text,
                             [tf.TensorSpec([None], tf.string, "prompt"), *sampling_specs])
    archive.write_out(path, verbose=False)
    return path
