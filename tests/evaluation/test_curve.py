"""Wilson intervals against hand-computed values; the curve built from logs and before/after."""

from __future__ import annotations

import math

import pytest

from grpo_plugin.evaluation.curve import (
    best_point,
    build_curve,
    curve_point,
    wilson_interval,
)

# z = 1.959964, z^2 = 3.841459, n = 8: the denominator D = 1 + z^2/8 = 1.480182, z/D = 1.324137.
#   0/8: center = (z^2/16) / D = 0.240091 / 1.480182 = 0.162204 = half  -> [0, 0.324408]
#   4/8: center = 0.5, half = (z/D) * sqrt(0.25/8 + z^2/256) = 1.324137 * sqrt(0.046256)
#        = 1.324137 * 0.215071 = 0.284784  -> [0.215216, 0.784784]
#   8/8: the mirror image of 0/8  -> [0.675592, 1]
HAND = {0: (0.0, 0.324408), 4: (0.215216, 0.784784), 8: (0.675592, 1.0)}


@pytest.mark.parametrize("successes", [0, 4, 8])
def test_wilson_interval_of_8_trials_matches_hand_values(successes):
    low, high = wilson_interval(successes, 8)
    assert low == pytest.approx(HAND[successes][0], abs=2e-6)
    assert high == pytest.approx(HAND[successes][1], abs=2e-6)


@pytest.mark.parametrize(("successes", "n"), [(1, 8), (28, 64), (46, 64), (3, 10)])
def test_wilson_bounds_solve_the_score_equation(successes, n):
    """Each bound p solves |p_hat - p| = z sqrt(p (1 - p) / n), the definition of the interval."""
    z, p_hat = 1.959963984540054, successes / n
    for p in wilson_interval(successes, n):
        assert abs(p_hat - p) == pytest.approx(z * math.sqrt(p * (1 - p) / n), abs=1e-12)


def test_wilson_rejects_impossible_counts():
    with pytest.raises(ValueError, match="wilson_interval"):
        wilson_interval(9, 8)
    with pytest.raises(ValueError, match="wilson_interval"):
        wilson_interval(0, 0)


def test_curve_point_rounds_the_interval_and_allows_unknown_n():
    assert curve_point(16, 0.5, 8) == {
        "step": 16,
        "accuracy": 0.5,
        "ci95": [0.2152, 0.7848],
        "n": 8,
    }
    assert curve_point(16, 0.5, None)["ci95"] is None


def test_build_curve_merges_before_logged_and_after():
    rows = [
        {"step": 1, "reward": 0.1},
        {"step": 2, "eval_accuracy": 0.25, "eval_n": 8},
        {"step": 4, "eval_accuracy": 0.5, "eval_n": 8},
        {"step": 4, "eval_accuracy": 0.625, "eval_n": 8},  # a resumed run logged step 4 again
        {"step": 5, "eval_accuracy": float("nan"), "eval_n": 8},  # not a number: skipped
    ]
    before, after = {"accuracy": 0.0, "n": 8}, {"accuracy": 1.0, "n": 8}
    curve = build_curve(rows, before, after, after_step=6)
    assert [(p["step"], p["accuracy"]) for p in curve] == [
        (0, 0.0),
        (2, 0.25),
        (4, 0.625),
        (6, 1.0),
    ]
    assert curve[0]["ci95"] == [0.0, 0.3244] and curve[-1]["ci95"] == [0.6756, 1.0]
    # the pipeline's evaluation wins where both measured the same step
    assert build_curve(rows, None, {"accuracy": 1.0, "n": 8}, after_step=4)[-1]["accuracy"] == 1.0


def test_best_point_respects_direction_and_prefers_the_earliest_tie():
    rows = [
        {"step": 2, "eval_accuracy": 0.5, "eval_loss": 0.3},
        {"step": 4, "eval_accuracy": 0.75, "eval_loss": 0.1},
        {"step": 6, "eval_accuracy": 0.75, "eval_loss": 0.2},
    ]
    assert best_point(rows, "eval_accuracy") == (4, 0.75)
    assert best_point(rows, "eval_loss", greater_is_better=False) == (4, 0.1)
    assert best_point(rows, "eval_missing") is None
