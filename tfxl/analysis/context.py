"""A language model's loss by context length: each target read with exactly c previous tokens.

For a target position t and a context c, the model starts from an empty memory, reads tokens
t - c .. t - 1 as evaluation reads a document (segments of tgt_len on its key/value memory of
mem_len positions: `tfxl.models.scoring.score_document`), and scores token t. So c may exceed
the segment length, and what the model makes of a long context is its own: its memory and its
layers decide how much of it reaches the target. Every target of a batch has the same c, so
the shapes are static and each context compiles once.

Cost: P targets x sum(contexts) token reads per model (plus one for each target).
"""

import numpy as np
from keras import ops

from tfxl.models.scoring import score_document

__all__ = ["MAX_BATCH_TOKENS", "context_losses", "target_positions"]

# The most tokens one call reads (batch_size x (context + 1)): the reading's activations and
# memory scale with it, so it is refused before anything is allocated.
MAX_BATCH_TOKENS = 1 << 22


def target_positions(num_tokens, count, max_context, *, seed=0):
    """`count` distinct target positions t with max_context <= t < num_tokens (every target has
    max_context tokens before it), drawn uniformly with `seed` and returned in increasing order:
    the same positions for every model of a group."""
    num_tokens, count, max_context = int(num_tokens), int(count), int(max_context)
    if count < 1:
        raise ValueError(f"positions: at least 1, got {count}")
    available = num_tokens - max_context
    if count > available:
        raise ValueError(f"positions: {count} asked, but the split has {max(available, 0)} "
                         f"targets with {max_context} tokens before them ({num_tokens} tokens)")
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(available, size=count, replace=False)) + max_context


def _windows(tokens, positions, context):
    offsets = np.arange(-context, 1)
    return tokens[positions[:, None] + offsets[None, :]]


def context_losses(model, tokens, positions, contexts, *, batch_size=32, tgt_len=None,
                   mem_len=None, progress=None):
    """The loss of each target in `positions` read with exactly c previous tokens, for every c
    in `contexts` (module docstring).

    Args:
      model: a `TransfoXLLM` or a baseline (`TransformerLM`, `LSTMLM`): anything
        `score_document` reads.
      tokens: int array [N], the split.
      positions: int array [P] of targets, each with max(contexts) tokens before it
        (`target_positions`).
      contexts: increasing ints >= 1.
      batch_size: targets read together.
      tgt_len, mem_len: the reading's segment and memory lengths (default: the model's
        evaluation settings).
      progress: called as progress(done, total) after each batch, in token reads.

    Returns:
      float64 array [len(contexts), P]: row k holds each target's NLL read with contexts[k]
      tokens.
    """
    tokens = np.asarray(tokens)
    positions = np.asarray(positions, dtype=np.int64)
    contexts = [int(c) for c in contexts]
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"tokens: a 1-D integer array, got {tokens.dtype} {list(tokens.shape)}")
    if not contexts or min(contexts) < 1 or sorted(set(contexts)) != contexts:
        raise ValueError(f"contexts: increasing ints >= 1, got {contexts}")
    if positions.ndim != 1 or positions.size == 0:
        raise ValueError(f"positions: a non-empty 1-D array, got shape {list(positions.shape)}")
    if positions.min() < contexts[-1] or positions.max() >= tokens.size:
        raise ValueError(f"positions: each in [{contexts[-1]}, {tokens.size}) (max(contexts) "
                         f"tokens before each target), got {positions.min()}..{positions.max()}")
    if not 1 <= int(batch_size) <= MAX_BATCH_TOKENS // (contexts[-1] + 1):
        raise ValueError(f"batch_size: 1..{MAX_BATCH_TOKENS // (contexts[-1] + 1)} for a "
                         f"context of {contexts[-1]} (at most {MAX_BATCH_TOKENS} tokens read at "
                         f"once), got {batch_size}")
    settings = model.config.eval_settings(tgt_len=tgt_len, mem_len=mem_len)
    batch_size = int(batch_size)
    total = positions.size * sum(c + 1 for c in contexts)
    done = 0
    losses = np.empty((len(contexts), positions.size))
    for k, context in enumerate(contexts):
        for start in range(0, positions.size, batch_size):
            chosen = positions[start:start + batch_size]
            windows = _windows(tokens, chosen, context)
            if len(chosen) < batch_size:  # the same shape for every batch: pad with a copy
                windows = np.concatenate(
                    [windows, np.repeat(windows[:1], batch_size - len(chosen), axis=0)])
            nll, _ = score_document(model, windows.astype(np.int32),
                                    tgt_len=settings["tgt_len"], mem_len=settings["mem_len"])
            losses[k, start:start + len(chosen)] = ops.convert_to_numpy(nll[:, -1])[:len(chosen)]
            done += len(chosen) * (context + 1)
            if progress is not None:
                progress(done, total)
    return losses
