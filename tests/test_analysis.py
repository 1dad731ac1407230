"""RECL (tfxl.analysis) against tables computed by hand from the paper's definition."""

import math

import numpy as np
import pytest

from tfxl.analysis import recl, relative_gains


def test_one_position_r_1_each_model_stops_where_its_loss_stops_falling():
    contexts = [0, 10, 20, 30]
    losses = {"short": [[4.0], [3.0], [3.0], [3.0]], "long": [[4.0], [3.0], [2.0], [2.0]]}
    assert recl(losses, contexts, r=1.0) == {"short": 10, "long": 20}
    gains = relative_gains(losses, contexts, r=1.0).gains
    np.testing.assert_allclose(gains["long"], [1 - math.exp(-1), 1 - math.exp(-1), 0.0])
    np.testing.assert_allclose(gains["short"], [1 - math.exp(-1), 0.0, 0.0])


def test_ties_among_the_hardest_positions_go_to_the_lower_position():
    # r = 0.5 of 4 positions: the 2 hardest at context 0 are positions 1 and 2 (b = 2 at 1, 2, 3).
    # Position 3 would gain a lot at context 1; positions 1 and 2 gain nothing.
    losses = {"m": [[1.0, 2.0, 2.0, 2.0], [1.0, 2.0, 2.0, 0.5], [1.0, 2.0, 2.0, 0.5]]}
    gains = relative_gains(losses, [0, 4, 8], r=0.5).gains["m"]
    assert gains[0] == 0.0
    assert recl(losses, [0, 4, 8], r=0.5) == {"m": 0}
    # With position 3 among the hardest (r = 0.75: positions 1, 2, 3) the gain is
    # 1 - exp(mean(2, 2, 0.5) - 2).
    gains = relative_gains(losses, [0, 4, 8], r=0.75).gains["m"]
    assert gains[0] == pytest.approx(1 - math.exp((2 + 2 + 0.5) / 3 - 2))
    assert recl(losses, [0, 4, 8], r=0.75) == {"m": 4}


def test_a_model_worse_everywhere_gains_only_up_to_the_best_models_loss():
    # "worse" improves with context, but never below the best model's loss at the shorter
    # context, so each of its gains is capped at zero: its RECL is the grid's first context.
    best = [[3.0, 3.0], [2.0, 2.0], [2.0, 2.0]]
    worse = [[4.0, 4.0], [3.5, 3.5], [2.5, 2.5]]
    result = relative_gains({"best": best, "worse": worse}, [16, 32, 48], r=1.0)
    np.testing.assert_allclose(result.gains["worse"], [0.0, 0.0])
    np.testing.assert_allclose(result.gains["best"], [1 - math.exp(-1), 0.0])
    assert recl({"best": best, "worse": worse}, [16, 32, 48], r=1.0) == {"best": 32, "worse": 16}


def test_the_hardest_positions_are_chosen_by_the_best_model_at_each_context():
    # Position 0 is hardest for the best of the group at context 0; position 1 at context 1.
    a = [[5.0, 1.0], [1.0, 4.0], [1.0, 1.0]]
    b = [[6.0, 2.0], [2.0, 5.0], [2.0, 5.0]]
    result = relative_gains({"a": a, "b": b}, [0, 1, 2], r=0.5)
    # k = 0: T = {0}, base exp(5); a at context 1: min(5, 1) = 1; b: min(5, 2) = 2.
    # k = 1: T = {1}, base exp(4); a at context 2: min(4, 1) = 1; b: min(4, 5) = 4.
    np.testing.assert_allclose(result.gains["a"], [1 - math.exp(-4), 1 - math.exp(-3)])
    np.testing.assert_allclose(result.gains["b"], [1 - math.exp(-3), 0.0])
    assert result.recl() == {"a": (2, True), "b": (1, False)}


def test_a_model_that_still_gains_at_the_grids_end_gets_its_last_context_as_a_lower_bound():
    losses = {"m": np.array([[3.0, 3.0], [2.5, 2.4], [2.0, 1.9]])}
    assert recl(losses, [100, 200, 300], r=1.0) == {"m": 300}
    assert relative_gains(losses, [100, 200, 300], r=1.0).recl() == {"m": (300, True)}
    # The same gains against a threshold above them end the search at the first context.
    assert recl(losses, [100, 200, 300], r=1.0, threshold=0.5) == {"m": 100}


def test_the_threshold_is_strict():
    gain = 1 - math.exp(-0.5)
    losses = {"m": [[1.5], [1.0], [1.0]]}
    assert recl(losses, [0, 1, 2], r=1.0, threshold=gain) == {"m": 1}
    assert recl(losses, [0, 1, 2], r=1.0, threshold=gain + 1e-9) == {"m": 0}


@pytest.mark.parametrize("losses, contexts, r, threshold, named", [
    ({}, [0, 1], 1.0, 0.01, "losses"),
    ({"m": [[1.0], [1.0]]}, [0], 1.0, 0.01, "contexts"),
    ({"m": [[1.0], [1.0], [1.0]]}, [0, 1, 3], 1.0, 0.01, "contexts"),
    ({"m": [[1.0], [1.0]]}, [1, 0], 1.0, 0.01, "contexts"),
    ({"m": [[1.0], [1.0]]}, [0, 1], 0.0, 0.01, "r"),
    ({"m": [[1.0], [1.0]]}, [0, 1], 1.5, 0.01, "r"),
    ({"m": [[1.0], [1.0]]}, [0, 1], 1.0, 0.0, "threshold"),
    ({"m": [[1.0], [1.0], [1.0]]}, [0, 1], 1.0, 0.01, "losses['m']"),
    ({"m": [[1.0], [float("nan")]]}, [0, 1], 1.0, 0.01, "losses['m']"),
    ({"m": [[1.0], [1.0]], "n": [[1.0, 1.0], [1.0, 1.0]]}, [0, 1], 1.0, 0.01, "losses"),
])
def test_a_bad_argument_is_one_error_naming_it(losses, contexts, r, threshold, named):
    with pytest.raises(ValueError, match=rf"^{named.replace('[', '.').replace(']', '.')}"):
        recl(losses, contexts, r, threshold)
