"""Generation on a key/value memory: each new token costs one one-token step and copies nothing.

Shape glossary: B batch, P prompt length, N new tokens, L layers, M memory length, W recent window,
D model size, H head size.

Why a window: appending one token to a [B, N, M, H] memory and dropping the oldest is a copy of
the whole memory in every layer (TensorFlow tensors are immutable), and at M in the thousands
that copy costs more than the token's attention. So the decode loop keeps the memory fixed and
writes new tokens' keys and values into a small window of W slots beside it; the step attends to
both (the oldest memory slots hidden as the window fills, so it always sees the last M
positions), and every W tokens the window is merged into the memory (one copy per W tokens).
"""

from typing import Any, NamedTuple

import tensorflow as tf

from tfxl.layers.memory import KeyValueMemory
from tfxl.models.sampling import sample_next

RECENT_WINDOW = 32
# Seeds s and s + 1 draw unrelated streams: token i of seed s is token j of seed s' only where
# s - s' = (j - i) * SEED_STRIDE (mod 2^32), never for small seeds and lengths. A prime.
SEED_STRIDE = 1_000_003
INT32_SEEDS = (-2**31, 2**31 - 1)  # the seeds every front end accepts (signatures: int32)


def token_seed(seed, step):
    """The one seed -> stream rule: token `step` (0, 1, ...) of a generation seeded `seed` is drawn
    with the stateless seed (token_seed(seed, step), 0), where token_seed = seed + step *
    SEED_STRIDE wrapped to int32. The rule composes: token i of one call seeded s is token 0 of
    a call seeded token_seed(s, i), so a client streaming one token per call (tfxl-generate,
    through a model or an export's `generate`) draws the tokens of `TransfoXLLM.generate`.

    Python ints give a Python int (what a client sends as `seed`); tensors an int32 tensor.
    """
    if isinstance(seed, int) and isinstance(step, int):
        return (seed + step * SEED_STRIDE - INT32_SEEDS[0]) % 2**32 + INT32_SEEDS[0]
    unsigned = (tf.bitcast(tf.cast(seed, tf.int32), tf.uint32)
                + tf.cast(step, tf.uint32) * tf.constant(SEED_STRIDE, tf.uint32))
    return tf.bitcast(unsigned, tf.int32)  # uint32 arithmetic wraps, int32's is undefined


def generate(model, prompt_ids, memory, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0,
             seed=0, prompt_valid=None, clamp_len=None, same_length=None):
    """Samples `max_new_tokens` (>= 1) tokens after `prompt_ids` [B, P], in-graph.

    `memory` is a key/value memory (a layer-input memory is converted first, exactly). The prompt
    is read in one segment step on top of it; then every new token is one step (a tf.while_loop)
    that projects only that token's keys and values, with the position keys computed once before
    the loop. `prompt_valid` [B, P] marks left padding (False) for prompts of different lengths.
    Token i is drawn with the stateless seed (token_seed(seed, i), 0). `same_length` changes
    nothing after the prompt: a single query sees the M + 1 positions either way.

    Returns (generated ids int32 [B, N], key/value memory). The memory holds the prompt and every
    generated token but the last, which has not been read yet: to continue, pass
    `generated[:, -1:]` as the next prompt with this memory (how streaming clients call it one
    token at a time).
    """
    memory = model.key_value_memory(memory)
    log_probs, memory = model(prompt_ids, memory, segment_valid=prompt_valid, clamp_len=clamp_len,
                              same_length=same_length)
    window = _RecentWindow(memory, RECENT_WINDOW)
    position_keys = model.position_keys(window.max_distance + 1, clamp_len)  # once
    batch = tf.shape(prompt_ids)[0]
    max_new_tokens = tf.cast(max_new_tokens, tf.int32)
    tf.debugging.assert_positive(max_new_tokens, message="max_new_tokens must be >= 1")
    seed = tf.cast(seed, tf.int32)

    def draw(step, last):
        return sample_next(_finite(last), temperature, top_k, top_p,
                           tf.stack([token_seed(seed, step), 0]))

    def body(step, last, state, out):
        token = draw(step, last)
        state = window.merged_if_full(state)
        parts, valid, distance = window.attended(state)
        next_log_probs, keys, values = model.decode_step(token[:, None], parts, valid, distance,
                                                         position_keys)
        return step + 1, next_log_probs[:, 0], window.appended(state, keys, values), out.write(
            step, token)

    out = tf.TensorArray(tf.int32, size=max_new_tokens, element_shape=[None])
    step, last, state, out = tf.while_loop(
        lambda step, *_: step < max_new_tokens - 1, body,
        (tf.constant(0), log_probs[:, -1], window.start(), out))
    out = out.write(step, draw(step, last))
    generated = tf.transpose(out.stack())  # [N, B] -> [B, N]
    return tf.reshape(generated, [batch, max_new_tokens]), window.memory(state)


def _finite(log_probs):
    """log_probs [B, V], once checked to hold no NaN and a finite maximum per row.

    Otherwise the sampler has nothing to draw from and returns V, outside the vocabulary: a
    non-finite memory gives that, and so can a finite one whose attention overflows. Raises
    InvalidArgumentError rather than return a token that means nothing.
    """
    ok = tf.logical_and(tf.reduce_all(tf.math.is_finite(tf.reduce_max(log_probs, axis=-1))),
                        tf.logical_not(tf.reduce_any(tf.math.is_nan(log_probs))))
    with tf.control_dependencies([tf.debugging.Assert(ok, [
            "generate: the next-token log-probabilities are not finite (NaN or infinite "
            "values in, or an overflow of, the memory or the weights): no token can be drawn"])]):
        return tf.identity(log_probs)


class _DecodeState(NamedTuple):
    memory: KeyValueMemory   # the last M positions before the window (fixed between merges)
    recent: KeyValueMemory   # W slots, the newest tokens; slot i valid once written
    filled: Any              # int32 scalar: window slots in use


class _RecentWindow:
    """The decode state: the memory (fixed between merges) plus a window of the newest tokens.

    State (a `_DecodeState`, a tf.while_loop variable): the `memory` (a KeyValueMemory), a
    `recent` KeyValueMemory of W slots, and "filled", the number r of window slots in use. The
    newest M positions are memory slots r..M-1 and window slots 0..r-1: memory slot f is at
    distance M - f + r from the token being read, window slot i at r - i.
    """

    def __init__(self, memory, size):
        self.initial = memory
        self.mem_len = memory.mem_len
        self.size = size
        self.max_distance = self.mem_len + size - 1

    def start(self):
        values = self.initial.values[0]  # [B, N, M, H]
        recent = KeyValueMemory.empty(tf.shape(values)[0], len(self.initial.values), self.size,
                                      values.shape[1], values.shape[3], values.dtype)
        return _DecodeState(self.initial, recent, tf.constant(0))

    def _joined(self, state, first):
        """Memory and window slots [first, first + M) of [memory; window], per layer."""
        def last_m(memory, recent, axis):
            joined = tf.concat([memory, recent], axis=axis)
            begin = [0] * len(joined.shape)
            begin[axis] = first
            size = [-1] * len(joined.shape)
            size[axis] = self.mem_len
            return tf.ensure_shape(tf.slice(joined, begin, size), memory.shape)
        memory, recent = state.memory, state.recent
        return KeyValueMemory(tuple(last_m(m, r, 3) for m, r in zip(memory.keys, recent.keys)),
                              tuple(last_m(m, r, 2) for m, r in zip(memory.values, recent.values)),
                              last_m(memory.valid, recent.valid, 1))

    def merged_if_full(self, state):
        """Every W tokens: the window moves into the memory (the one copy of the memory)."""
        def merge():
            recent = state.recent._replace(valid=tf.zeros_like(state.recent.valid))
            return _DecodeState(self._joined(state, self.size), recent, tf.constant(0))
        return tf.cond(state.filled >= self.size, merge, lambda: state)

    def attended(self, state):
        """(per-layer parts, valid [B, M + W], distances [M + W + 1]) for the next token."""
        filled = state.filled
        distance = tf.concat([self.mem_len - tf.range(self.mem_len) + filled,
                              filled - tf.range(self.size), [0]], axis=0)
        # A slot is seen when it holds a token within the last M positions.
        in_window = (distance[:-1] >= 1) & (distance[:-1] <= self.mem_len)
        memory, recent = state.memory, state.recent
        valid = tf.concat([memory.valid, recent.valid], axis=1) & in_window[None, :]
        parts = [[(k, v), (rk, rv)] for k, v, rk, rv in zip(
            memory.keys, memory.values, recent.keys, recent.values)]
        return parts, valid, distance

    def appended(self, state, keys, values):
        """The token's keys [B, N, H, 1] and values [B, N, 1, H] per layer written into window
        slot r (a select over the W slots: small, and no scatter in a loop)."""
        slot = tf.range(self.size) == state.filled  # [W]
        recent = state.recent
        recent = KeyValueMemory(
            tuple(tf.where(slot, k, old) for k, old in zip(keys, recent.keys)),
            tuple(tf.where(slot[:, None], v, old) for v, old in zip(values, recent.values)),
            recent.valid | slot[None, :])
        return _DecodeState(state.memory, recent, state.filled + 1)

    def memory(self, state):
        """The key/value memory of the newest M positions."""
        return self._joined(state, state.filled)
