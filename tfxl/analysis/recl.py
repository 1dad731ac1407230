"""How much context a group of language models uses: the Relative Effective Context Length.

RECL (Dai et al., 2019, Appendix C) compares models of one group on the same target tokens, each
read with exactly c previous tokens, for a grid of contexts c. For model i, l_i(c, t) is its loss
on target t with context c, and b(c, t) = min_i l_i(c, t) the best of the group. At context c
only the hardest targets count: T(c), the ceil(r * P) of the P targets with the largest b(c, t)
(ties broken by the lower target index). Then

    f_i(c, c') = mean over t in T(c) of min(b(c, t), l_i(c', t))
    g_i(c, c') = (exp f_i(c, c) - exp f_i(c, c')) / exp f_i(c, c)

is the relative gain of model i when its context grows from c to c', measured against the best
model at c (f_i(c, c) is the mean of b over T(c), the same for every model). Going up the grid,
RECL_i is the first c_k whose gain to the next context c_{k+1} is below the threshold; a model
that still gains at the grid's last step gets the last context, a lower bound (`reached_end`).

Numpy only: the losses come from any backend.
"""

import math

import numpy as np

__all__ = ["RelativeGains", "recl", "relative_gains"]


def _checked(losses, contexts, r, threshold):
    if not isinstance(losses, dict) or not losses:
        raise ValueError("losses: a dict of model name -> array [len(contexts), positions], "
                         f"got {type(losses).__name__} {losses!r:.80}")
    contexts = [int(c) for c in contexts]
    if len(contexts) < 2:
        raise ValueError(f"contexts: at least two, got {contexts}")
    steps = {b - a for a, b in zip(contexts, contexts[1:])}
    if min(contexts) < 0 or len(steps) != 1 or min(steps) <= 0:
        raise ValueError(f"contexts: increasing from a context >= 0 with one constant step, got "
                         f"{contexts}")
    if not (isinstance(r, (int, float)) and 0 < r <= 1):
        raise ValueError(f"r: a fraction of the positions in (0, 1], got {r!r}")
    if not (isinstance(threshold, (int, float)) and 0 < threshold < 1):
        raise ValueError(f"threshold: a relative gain in (0, 1), got {threshold!r}")
    arrays = {}
    for name, value in losses.items():
        array = np.asarray(value, dtype=np.float64)
        if array.ndim != 2 or array.shape[0] != len(contexts) or array.shape[1] < 1:
            raise ValueError(f"losses[{name!r}]: shape [len(contexts)={len(contexts)}, "
                             f"positions >= 1], got {list(array.shape)}")
        if not np.all(np.isfinite(array)):
            raise ValueError(f"losses[{name!r}]: every loss finite, found "
                             f"{int(np.sum(~np.isfinite(array)))} that are not")
        arrays[name] = array
    positions = {a.shape[1] for a in arrays.values()}
    if len(positions) != 1:
        raise ValueError("losses: every model scored on the same positions, got "
                         + ", ".join(f"{n!r}: {a.shape[1]}" for n, a in arrays.items()))
    return arrays, contexts


class RelativeGains:
    """g_i(c_k, c_{k+1}) for every model of a group and every step k of the grid (the module
    docstring): `gains[name]` is an array [len(contexts) - 1]."""

    def __init__(self, losses, contexts, r):
        arrays, self.contexts = _checked(losses, contexts, r, 0.5)
        self.r = float(r)
        names = list(arrays)
        stacked = np.stack([arrays[n] for n in names])  # [models, contexts, P]
        best = stacked.min(axis=0)                        # b(c, t)
        positions = best.shape[1]
        hardest = math.ceil(self.r * positions)
        self.gains = {n: np.empty(len(self.contexts) - 1) for n in names}
        for k in range(len(self.contexts) - 1):
            # Largest b first; a stable sort keeps the lower index first among equal losses.
            chosen = np.argsort(-best[k], kind="stable")[:hardest]
            base = np.exp(best[k, chosen].mean())            # exp f_i(c, c), every model's
            for i, name in enumerate(names):
                grown = np.minimum(best[k, chosen], stacked[i, k + 1, chosen]).mean()
                self.gains[name][k] = (base - np.exp(grown)) / base

    def recl(self, threshold=0.01):
        """{name: (RECL, reached_end)}: the first c_k whose gain to c_{k+1} is below
        `threshold`; (the last context, True) where every gain is at least `threshold`."""
        result = {}
        for name, gains in self.gains.items():
            below = np.flatnonzero(gains < threshold)
            result[name] = ((self.contexts[int(below[0])], False) if below.size
                            else (self.contexts[-1], True))
        return result


def relative_gains(losses, contexts, r):
    """The `RelativeGains` of a group: `losses` maps a model's name to its losses, an array
    [len(contexts), P] (row k: each of the P targets read with exactly contexts[k] tokens)."""
    return RelativeGains(losses, contexts, r)


def recl(losses, contexts, r, threshold=0.01):
    """Each model's Relative Effective Context Length in the group `losses` (the module docstring).

    Args:
      losses: {model name: array [len(contexts), P]}, every model scored on the same P targets.
      contexts: the grid c_0 < c_1 < ..., one constant step.
      r: the fraction of the hardest targets that count, in (0, 1].
      threshold: the relative gain below which more context no longer helps.

    Returns:
      {name: RECL as an int}. A model whose gain never falls below `threshold` gets the grid's
      last context: its RECL is at least that (`relative_gains(...).recl()` says which).

    Examples:

    ```python
    from tfxl.analysis import recl

    # One target, read with 0, 10, 20 and 30 previous tokens by two models.
    losses = {"short": [[4.0], [3.0], [3.0], [3.0]], "long": [[4.0], [3.0], [2.0], [2.0]]}
    assert recl(losses, [0, 10, 20, 30], r=1.0) == {"short": 10, "long": 20}
    ```
    """
    _checked(losses, contexts, r, threshold)
    return {name: value for name, (value, _) in
            relative_gains(losses, contexts, r).recl(threshold).items()}
