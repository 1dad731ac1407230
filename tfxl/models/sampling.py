"""Next-token sampling: temperature, top-k and nucleus (top-p), stateless and in-graph.

Shape glossary: B batch, V vocabulary size.
"""

import tensorflow as tf


def sampling_rules(max_new_tokens, temperature, top_k, top_p):
    """The valid range of each sampling input, the one definition every front end checks against.

    Returns (name, ok, requirement, value) per input; `ok` is a Python bool for Python numbers
    (`check_sampling`, the tfxl-generate flags) and a bool tensor for tensors (the exported
    signatures' in-graph checks). NaN is out of every range.
    """
    return [("max_new_tokens", max_new_tokens >= 1, "must be >= 1", max_new_tokens),
            ("temperature", temperature >= 0, "must be >= 0 (0 = greedy)", temperature),
            ("top_k", top_k >= 0, "must be >= 0 (0 = off)", top_k),
            ("top_p", (top_p > 0) & (top_p <= 1), "must be in (0, 1] (1 = off)", top_p)]


def check_sampling(max_new_tokens, temperature, top_k, top_p):
    """Raises ValueError naming the first of these Python values that is out of its range."""
    for name, ok, requirement, value in sampling_rules(max_new_tokens, temperature, top_k, top_p):
        if not ok:
            raise ValueError(f"{name} {requirement}, got {value}")


def sample_next(log_probs, temperature, top_k, top_p, seed):
    """One token per row from log-probabilities [B, V].

    temperature <= 0 picks the most likely token (greedy); top_k <= 0 and top_p >= 1 disable those
    filters; top_p <= 0 keeps only the most likely token (front ends refuse it: `sampling_rules`).
    `seed` is a [2] int32 tensor: the same seed gives the same tokens (stateless RNG).
    Returns int32 [B].
    """
    log_probs = tf.cast(log_probs, tf.float32)
    temperature = tf.cast(temperature, tf.float32)
    vocab = tf.shape(log_probs)[-1]
    logits = log_probs / tf.maximum(temperature, 1e-6)
    # top-k: keep logits >= the k-th largest (k clamped to [1, V]; k <= 0 keeps all).
    k = tf.where(top_k > 0, tf.minimum(tf.cast(top_k, tf.int32), vocab), vocab)
    kth = tf.math.top_k(logits, k=k).values[:, -1:]
    logits = tf.where(logits < kth, tf.float32.min, logits)
    # top-p: keep the smallest set of most likely tokens whose probability reaches p.
    sorted_logits = tf.sort(logits, direction="DESCENDING", axis=-1)
    sorted_probs = tf.nn.softmax(sorted_logits, axis=-1)
    mass_before = tf.cumsum(sorted_probs, axis=-1, exclusive=True)
    top_p = tf.cast(top_p, tf.float32)
    most_likely = tf.range(vocab) == 0  # always kept, whatever p (p <= 0 means greedy)
    kept = (mass_before < top_p) | (top_p >= 1.0) | most_likely[None, :]
    threshold = tf.reduce_min(tf.where(kept, sorted_logits, tf.float32.max), axis=-1,
                              keepdims=True)
    logits = tf.where(logits < threshold, tf.float32.min, logits)
    sampled = tf.random.stateless_categorical(logits, 1, seed=seed, dtype=tf.int32)[:, 0]
    greedy = tf.argmax(log_probs, axis=-1, output_type=tf.int32)
    return tf.where(temperature > 0, sampled, greedy)
