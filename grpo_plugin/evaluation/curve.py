"""The held-out curve: one point per evaluation, with a 95% Wilson score interval.

An evaluation of greedy accuracy on n prompts is n Bernoulli trials, so its uncertainty is a
binomial proportion interval. We use the Wilson score interval (Wilson 1927, "Probable
Inference, the Law of Succession, and Statistical Inference", JASA 22(158); recommended over the
normal approximation by Brown, Cai & DasGupta 2001, https://doi.org/10.1214/ss/1009213286):

    center = (p + z^2 / 2n) / (1 + z^2 / n)
    half   = z / (1 + z^2 / n) * sqrt(p (1 - p) / n + z^2 / 4n^2)

with p = successes / n. Unlike p +- z sqrt(p(1-p)/n) it never leaves [0, 1] and is not zero-width
at 0/n or n/n, which is where small held-out sets often sit.

A curve point is `{"step", "accuracy", "ci95": [low, high], "n"}`. Points come from the run's
`metrics.jsonl` (the trainer logs `eval_accuracy` and `eval_n` at every evaluation) plus the
recipe pipeline's evaluations before training (step 0) and after it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

Z95 = 1.959963984540054  # the 0.975 quantile of the standard normal
ACCURACY_KEY = "eval_accuracy"
N_KEY = "eval_n"


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of `successes` out of `n` trials (95% for the default z)."""
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(
            f"wilson_interval needs n >= 1 and 0 <= successes <= n, got {successes}/{n}"
        )
    p = successes / n
    z2 = z * z
    denominator = 1.0 + z2 / n
    center = (p + z2 / (2 * n)) / denominator
    half = z / denominator * math.sqrt(p * (1.0 - p) / n + z2 / (4 * n * n))
    return max(0.0, center - half), min(1.0, center + half)


def curve_point(step: int, accuracy: float, n: int | None) -> dict[str, Any]:
    """One point of the curve; `ci95` is None when n is unknown."""
    ci = None
    if n:
        low, high = wilson_interval(round(accuracy * n), int(n))
        ci = [round(low, 4), round(high, 4)]
    return {"step": int(step), "accuracy": accuracy, "ci95": ci, "n": n}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def logged_points(
    rows: Sequence[dict[str, Any]], key: str = ACCURACY_KEY, n_key: str = N_KEY
) -> list[dict[str, Any]]:
    """Curve points of the evaluations logged in `metrics.jsonl` rows (one per eval row)."""
    points = []
    for row in rows:
        if _number(row.get(key)) and _number(row.get("step")):
            n = row.get(n_key)
            points.append(curve_point(row["step"], row[key], int(n) if _number(n) else None))
    return points


def build_curve(
    rows: Sequence[dict[str, Any]],
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    after_step: int | None = None,
) -> list[dict[str, Any]]:
    """Every evaluation, sorted by step: `before` at step 0, the logged ones, `after` at
    `after_step`. At a step measured twice the pipeline's evaluation wins (it is the one
    `eval.json` reports), and a later log line wins over an earlier one (a resumed run)."""
    by_step: dict[int, dict[str, Any]] = {p["step"]: p for p in logged_points(rows)}
    for step, result in ((0, before), (after_step, after)):
        if result and step is not None and _number(result.get("accuracy")):
            by_step[int(step)] = curve_point(step, result["accuracy"], result.get("n"))
    return [by_step[step] for step in sorted(by_step)]


def best_point(
    rows: Sequence[dict[str, Any]], metric: str, greater_is_better: bool = True
) -> tuple[int, float] | None:
    """(step, value) of the best logged value of `metric`; the earliest step wins a tie (as the
    Trainer's best-model tracking, which needs a strict improvement)."""
    best: tuple[int, float] | None = None
    for row in rows:
        value = row.get(metric)
        if not _number(value) or not _number(row.get("step")):
            continue
        if best is None or (value > best[1] if greater_is_better else value < best[1]):
            best = (int(row["step"]), float(value))
    return best
