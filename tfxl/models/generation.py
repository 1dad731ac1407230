"""Generation on a key/value memory: each new token costs one one-token segment step.

Shape glossary: B batch, P prompt length, N new tokens, L layers, M memory length, D model size.
"""

import tensorflow as tf

from tfxl.layers.memory import VALID, per_layer, stacked
from tfxl.models.sampling import sample_next


def generate(model, prompt_ids, memory, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0,
             seed=0, prompt_valid=None, clamp_len=None, same_length=None):
    """Samples `max_new_tokens` (>= 1) tokens after `prompt_ids` [B, P], in-graph.

    `memory` is a key/value memory (a layer-input memory is converted first, exactly). The prompt
    is read in one segment step on top of it; then every new token is one segment step of length
    1 (a tf.while_loop) that projects only that token's keys and values, with the position keys
    of K = M + 1 computed once before the loop. `prompt_valid` [B, P] marks left padding (False)
    for prompts of different lengths. Token i is drawn with the stateless seed (seed, i).

    Returns (generated ids int32 [B, N], key/value memory). The memory holds the prompt and every
    generated token but the last, which has not been read yet: to continue, pass
    `generated[:, -1:]` as the next prompt with this memory (how streaming clients call it one
    token at a time).
    """
    run = dict(clamp_len=clamp_len, same_length=same_length)
    memory = model.key_value_memory(memory)
    log_probs, memory = model(prompt_ids, memory, segment_valid=prompt_valid, **run)
    step_position_keys = model.position_keys(memory[VALID].shape[1] + 1, clamp_len)
    batch = tf.shape(prompt_ids)[0]
    max_new_tokens = tf.cast(max_new_tokens, tf.int32)
    tf.debugging.assert_positive(max_new_tokens, message="max_new_tokens must be >= 1")
    seed = tf.cast(seed, tf.int32)

    def draw(step, last):
        return sample_next(last, temperature, top_k, top_p, tf.stack([seed, step]))

    def body(step, last, memory, out):
        token = draw(step, last)
        next_log_probs, memory = model(token[:, None], memory, position_keys=step_position_keys,
                                       **run)
        return step + 1, next_log_probs[:, 0], memory, out.write(step, token)

    out = tf.TensorArray(tf.int32, size=max_new_tokens, element_shape=[None])
    step, last, memory, out = tf.while_loop(
        lambda step, *_: step < max_new_tokens - 1, body,
        (tf.constant(0), log_probs[:, -1], per_layer(memory), out))
    memory = stacked(memory)
    out = out.write(step, draw(step, last))
    generated = tf.transpose(out.stack())  # [N, B] -> [B, N]
    return tf.reshape(generated, [batch, max_new_tokens]), memory
