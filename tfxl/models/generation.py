"""Generation on a key/value memory: each new token costs one one-token step and copies nothing.

Shape glossary: B batch, P prompt length, N new tokens, L layers, M memory length, W recent window,
D model size, H head size.

The prompt is read on a `KeyValueMemory` as evaluation reads a document (`read_prompt`: segments
of T, the evaluation tgt_len, each attending to at most M + T keys, so a prompt of any length
costs what one segment costs); the new tokens on a `RecentWindowMemory`, which keeps that memory
fixed and writes each token into a small window beside it (see the class: appending to the
memory would copy it on every token).

`keras.ops` only, so it runs on every backend: the loop is `ops.while_loop` (TensorFlow's
tf.while_loop, in-graph with a tensor N, as the SavedModel signatures call it; JAX's
lax.while_loop; a Python loop on PyTorch), and the tokens go into a preallocated [B, N] buffer
(`ops.slice_update`), so N must be a Python int on JAX (it is a shape there).
"""

from keras import ops

from tfxl import sizing
from tfxl import backend
from tfxl.layers.counter_hash import as_int32, as_uint32, wrapped
from tfxl.layers.memory import RecentWindowMemory
from tfxl.models.sampling import sample_next

RECENT_WINDOW = 32
# Seeds s and s + 1 draw unrelated streams: token i of seed s is token j of seed s' only where
# s - s' = (j - i) * SEED_STRIDE (mod 2^32), never for small seeds and lengths. A prime.
SEED_STRIDE = 1_000_003
INT32_SEEDS = (-2**31, 2**31 - 1)  # the seeds every front end accepts (signatures: int32)
# The id of a token that could not be drawn (non-finite log-probabilities) where nothing can
# raise: inside a compiled loop other than TensorFlow's (`_finite`).
NO_TOKEN = -1
NOT_FINITE = ("generate: the next-token log-probabilities are not finite (NaN or infinite values "
              "in, or an overflow of, the memory or the weights): no token can be drawn")


# The most a generation may allocate for one of its sizes (a memory, one segment's attention
# scores, the new tokens' buffer): 2 GiB, as the SavedModel signatures bound a request's memory
# (`tfxl.saved_model.signature_set.MAX_MEMORY_BYTES`, a protobuf message's limit).
MAX_GENERATION_BYTES = 2**31


def _gib(size):
    return f"{size / 2**30:.1f} GiB"


def check_generation_sizes(config, batch, mem_len, tgt_len, max_new_tokens, names=None):
    """Raises ValueError naming the size (by `names`: {"mem_len": "--mem_len", ...}, default the
    argument names) when one of a generation's allocations would exceed MAX_GENERATION_BYTES:
    the key/value memory with its recent window (batch x (M + W) slots of 8·L·N·H + 1 bytes),
    one prompt segment's attention scores (batch x N x T x (M + T) float32 per layer) or the new
    tokens' buffer (batch x max_new_tokens int32). Checked before anything is built, so that a
    size no machine holds is one line naming it, not an out-of-memory error deep inside."""
    names = {"batch": "batch", "mem_len": "mem_len", "tgt_len": "tgt_len",
             "max_new_tokens": "max_new_tokens", **(names or {})}
    limit = MAX_GENERATION_BYTES
    slot = sizing.key_value_slot_bytes(config)
    memory = batch * sizing.key_value_memory_row_bytes(config, mem_len + RECENT_WINDOW)
    if memory > limit:
        raise ValueError(
            f"{names['mem_len']}={mem_len}: a key/value memory of {mem_len} slots (+ "
            f"{RECENT_WINDOW} for the recent window) x {batch} row(s) needs {_gib(memory)} for "
            f"this model ({slot} bytes a slot: 8 x n_layer x n_head x d_head + 1); at most "
            f"{max(0, limit // (batch * slot) - RECENT_WINDOW)} slots fit in {_gib(limit)}")
    scores = sizing.attention_score_bytes(config, batch, tgt_len, mem_len + tgt_len)
    if scores > limit:
        raise ValueError(
            f"{names['mem_len']}={mem_len} with {names['tgt_len']}={tgt_len}: one prompt "
            f"segment's attention scores ({batch} x n_head {config.n_head} x {tgt_len} x "
            f"{mem_len + tgt_len} float32) need {_gib(scores)}, over {_gib(limit)}; lower either")
    check_new_tokens(batch, max_new_tokens, names["max_new_tokens"])


def check_new_tokens(batch, max_new_tokens, name="max_new_tokens"):
    """ValueError naming `name` when the new tokens' buffer, batch x max_new_tokens int32, would
    exceed MAX_GENERATION_BYTES."""
    limit = MAX_GENERATION_BYTES
    if sizing.new_token_bytes(batch, max_new_tokens) > limit:
        raise ValueError(f"{name}={max_new_tokens}: at most {limit // (4 * batch)} new tokens "
                         f"per row ({_gib(limit)} of int32 token ids for {batch} row(s))")


def token_seed(seed, step):
    """The one seed -> stream rule: token `step` (0, 1, ...) of a generation seeded `seed` is drawn
    with the stateless seed (token_seed(seed, step), 0), where token_seed = seed + step *
    SEED_STRIDE wrapped to int32. The rule composes: token i of one call seeded s is token 0 of
    a call seeded token_seed(s, i), so a client streaming one token per call (tfxl-generate,
    through a model or an export's `generate`) draws the tokens of `TransfoXLLM.generate`.

    Python ints give a Python int (what a client sends as `seed`); tensors an int32 tensor, the
    same on every backend.
    """
    if isinstance(seed, int) and isinstance(step, int):
        return (seed + step * SEED_STRIDE - INT32_SEEDS[0]) % 2**32 + INT32_SEEDS[0]
    # In uint32, whose arithmetic wraps modulo 2^32 (int32's overflow is undefined).
    unsigned = wrapped(as_uint32(seed) + wrapped(as_uint32(step) * as_uint32(SEED_STRIDE)))
    return as_int32(unsigned)


def read_prompt(model, prompt_ids, memory, segment_len, prompt_valid=None, clamp_len=None,
                same_length=None):
    """Reads `prompt_ids` [B, P] on the key/value `memory` in segments of `segment_len` (T), as
    `score_document` reads a document: (P - 1) // T full segments in one loop
    (`ops.while_loop`, the backbone only: no softmax), then the 1..T tokens left, whose last
    log-probabilities are returned. Every segment attends to at most M + T keys, so memory use
    does not grow with P. `prompt_valid` [B, P]: False at left padding.

    Where the memory holds the whole prompt (P <= T, or a fresh memory with P <= M) this equals
    reading it as one segment, same_length or not (each query sees every earlier token either
    way); a longer prompt is read as evaluation reads, each token seeing at most M + T earlier.

    Returns (log_probs [B, V] of the prompt's last token, key/value memory after the prompt).
    """
    memory = model.key_value_memory(memory)
    run = dict(clamp_len=clamp_len, same_length=same_length)
    batch, length = ops.shape(prompt_ids)[0], ops.shape(prompt_ids)[1]
    full = (length - 1) // segment_len  # segments before the last, which holds 1..T tokens
    head = full * segment_len

    def segments(x):  # [B, P] -> [B, full, T]
        return ops.reshape(x[:, :head], (batch, full, segment_len))

    ids = segments(prompt_ids)
    valid = None if prompt_valid is None else segments(ops.cast(prompt_valid, "bool"))
    position_keys = model.position_keys(memory.key_length(segment_len), clamp_len)

    def body(step, memory):
        _, memory = model.backbone(ids[:, step], memory, position_keys=position_keys,
                                   segment_valid=None if valid is None else valid[:, step], **run)
        return step + 1, memory

    if not isinstance(full, int) or full > 0:  # a static 0 (JAX) traces no body to index into
        _, memory = ops.while_loop(lambda step, *_: step < full, body,
                                   (ops.convert_to_tensor(0, "int32"), memory))
    log_probs, memory = model(prompt_ids[:, head:], memory, **run, segment_valid=(
        None if prompt_valid is None else prompt_valid[:, head:]))
    return log_probs[:, -1], memory


def generate(model, prompt_ids, memory, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0,
             seed=0, prompt_valid=None, clamp_len=None, same_length=None, tgt_len=None):
    """Samples `max_new_tokens` (>= 1) tokens after `prompt_ids` [B, P], in one loop.

    `memory` is a key/value memory (a layer-input memory is converted first, exactly). The prompt
    is read on top of it in segments of `tgt_len` (default the config's evaluation tgt_len;
    `read_prompt`), so any prompt length costs one segment's memory; then every new token is one
    step (`ops.while_loop`)
    that projects only that token's keys and values, with the position keys computed once before
    the loop. `prompt_valid` [B, P] marks left padding (False) for prompts of different lengths.
    Token i is drawn with the stateless seed (token_seed(seed, i), 0): the same tokens on every
    backend. `same_length` changes nothing after the prompt: a single query sees the M + 1
    positions either way.

    Lengths: on TensorFlow `max_new_tokens` and the prompt's shape may be tensors (one trace
    serves every length); on JAX they are static (`max_new_tokens` a Python int: under
    `jax.jit`, a static argument), as every shape is there.

    Non-finite log-probabilities (no token can be drawn; see `_finite`): TensorFlow raises
    InvalidArgumentError (eagerly and in a tf.function; under XLA, which drops the assertion,
    as below). Elsewhere the row's ids are NO_TOKEN (-1) from that token on, and a call whose
    values are concrete (eager JAX, PyTorch) raises ValueError; under `jax.jit` the -1 ids are
    the signal (`TransfoXLLM.generate` raises that ValueError on them).

    Returns (generated ids int32 [B, N], key/value memory). The memory holds the prompt and every
    generated token but the last, which has not been read yet: to continue, pass
    `generated[:, -1:]` as the next prompt with this memory (how streaming clients call it one
    token at a time).
    """
    segment_len = model.config.eval_settings(tgt_len=tgt_len)["tgt_len"]
    last_log_probs, memory = read_prompt(model, prompt_ids, memory, segment_len, prompt_valid,
                                         clamp_len, same_length)
    window = RecentWindowMemory.from_memory(memory, RECENT_WINDOW)
    position_keys = model.position_keys(window.key_length(1), clamp_len)  # once
    batch = ops.shape(prompt_ids)[0]
    max_new_tokens = _positive_length(max_new_tokens)
    seed = ops.cast(seed, "int32")

    def draw(step, last, failed):
        """(token [B], failed [B]): failed rows, once, stay so and draw NO_TOKEN."""
        last, ok = _finite(last)
        token = sample_next(last, temperature, top_k, top_p,
                            ops.stack([token_seed(seed, step), ops.zeros_like(seed)]))
        failed = ops.logical_or(failed, ops.logical_not(ok))
        return ops.where(failed, NO_TOKEN, token), failed

    def written(out, step, token):
        return ops.slice_update(out, (0, step), ops.expand_dims(token, 1))

    def body(step, last, window, failed, out):
        token, failed = draw(step, last, failed)
        # A row that failed reads id 0 from then on (its ids are NO_TOKEN whatever it reads).
        next_log_probs, window = model(ops.expand_dims(ops.maximum(token, 0), 1),
                                       window.merged_if_full(), position_keys=position_keys)
        return step + 1, next_log_probs[:, 0], window, failed, written(out, step, token)

    step, last, window, failed, out = ops.while_loop(
        lambda step, *_: step < max_new_tokens - 1, body,
        (ops.convert_to_tensor(0, "int32"), last_log_probs, window,
         ops.zeros((batch,), "bool"), ops.zeros((batch, max_new_tokens), "int32")))
    token, failed = draw(step, last, failed)
    backend.current().raise_if_any(failed, NOT_FINITE)
    return written(out, step, token), window.to_memory()


def _positive_length(max_new_tokens):
    """max_new_tokens, checked >= 1 where that can be known: a Python int (ValueError), a
    TensorFlow tensor (an in-graph assertion, InvalidArgumentError), a concrete array."""
    message = "max_new_tokens must be >= 1"
    if isinstance(max_new_tokens, int):
        if max_new_tokens < 1:
            raise ValueError(f"{message}, got {max_new_tokens}")
        return max_new_tokens
    return backend.current().positive_length(max_new_tokens, message)


def _finite(log_probs):
    """(log_probs [B, V], ok [B]): ok where the row has no NaN and a finite maximum.

    Otherwise the sampler has nothing to draw from and would return an id that means nothing: a
    non-finite memory gives that, and so can a finite one whose attention overflows. TensorFlow
    checks it in the graph (InvalidArgumentError, as the SavedModel signatures always have);
    other backends raise ValueError where the values are concrete (PyTorch, eagerly), and
    inside a compiled loop (JAX's lax.while_loop, eager calls included) leave it to `generate`,
    which marks the row's ids NO_TOKEN and raises once the values are concrete.
    """
    ok = ops.logical_and(ops.isfinite(ops.max(log_probs, axis=-1)),
                         ops.logical_not(ops.any(ops.isnan(log_probs), axis=-1)))
    return backend.current().checked_finite(log_probs, ok, NOT_FINITE), ok


def compiled_generate(model, mem_len, clamp_len=None, same_length=None):
    """`generate` from an empty memory of `mem_len` slots as each backend runs a loop best, for
    `TransfoXLLM.generate`: fn(ids int32 [B, P], max_new_tokens int, temperature, top_k, top_p,
    seed) -> ids [B, max_new_tokens] (a backend tensor).

    TensorFlow: one tf.function of any batch, prompt length and N (one trace per memory length).
    JAX: `jax.jit` with N static (one compile per batch, prompt length and N) and the model's
    variables as arguments, so that it always reads the current weights. PyTorch: eager, without
    autograd's bookkeeping.
    """
    run = dict(clamp_len=clamp_len, same_length=same_length)

    def loop(ids, n, temperature, top_k, top_p, seed):
        memory = model.init_key_value_memory(ops.shape(ids)[0], mem_len)
        return generate(model, ids, memory, n, temperature, top_k, top_p, seed, **run)[0]

    return backend.current().compiled_generate(loop, model)
