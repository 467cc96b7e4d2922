"""Call the reward functions on a rollout and turn their answers into a reward matrix.

TRL's contract: `fn(prompts, completions, completion_ids, **columns) -> list[float | None]`; what
an answer must be is in `checks.py`, where and how each function is called (a worker process that
a time limit can kill, or here) in `calls.py`.

`RewardScorer` is the one way the package calls reward functions: training, overlapped scoring,
evaluation during training, the recipe's before/after evaluation and `grpo-plugin eval` all score
through it, so the run's checks (`reward_timeout`, non-finite values, names in errors, the worker
process) hold everywhere. It has no default checks: whoever builds one says which apply.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from reward_fns import is_async_reward

from ..rollout.types import Rollout
from .answer_checks import RewardChecks, RewardFunctionError
from .calls import call_async, call_sync
from .context import RewardContext

__all__ = ["RewardChecks", "RewardFunctionError", "RewardScorer", "combine_rewards"]


def _score_completions(
    scorer: RewardScorer,
    prompts: list[Any],
    completions: list[Any],
    completion_ids: list[list[int]],
    columns: dict[str, list[Any]],
) -> torch.Tensor:
    """Return per-function rewards, shape (N, F), NaN where a function did not score."""
    n, funcs = len(completions), scorer.funcs
    kwargs = {"prompts": prompts, "completions": completions, "completion_ids": completion_ids}
    kwargs.update(columns)
    results: dict[int, list[float]] = {}
    async_idx = [i for i, fn in enumerate(funcs) if is_async_reward(fn)]
    for i, fn in enumerate(funcs):
        if i not in async_idx:
            results[i] = call_sync(fn, kwargs, scorer.checks, scorer.context)
    if async_idx:
        outs = call_async([funcs[i] for i in async_idx], kwargs, scorer.checks, scorer.context)
        results.update(zip(async_idx, outs))
    matrix = [results[i] for i in range(len(funcs))]
    return torch.tensor(matrix, dtype=torch.float32).T.reshape(n, len(funcs))  # (N, F)


def combine_rewards(per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted sum over functions, ignoring NaN; NaN only where no function scored. (N, F) -> (N,)"""
    scored = ~torch.isnan(per_func)
    total = torch.where(scored, per_func, 0.0) @ weights
    return torch.where(scored.any(dim=1), total, torch.nan)


@dataclass(frozen=True)
class RewardScorer:
    """Reward functions, their weights and the checks their answers get: the one scorer. With a
    `context`, each function also gets the trainer kwargs it declares (`context.py`)."""

    funcs: tuple[Callable, ...]
    weights: torch.Tensor  # (F,)
    checks: RewardChecks
    context: RewardContext | None = None

    def first(self) -> RewardScorer:
        """The first function alone, weight 1 (held-out accuracy is read from it)."""
        return RewardScorer(self.funcs[:1], torch.ones(1), self.checks, self.context)

    def score_columns(
        self, prompts: list[Any], completions: list[Any], completion_ids: list, columns: dict
    ) -> torch.Tensor:
        """Per-function rewards `(N, F)`, NaN where a function did not score."""
        return _score_completions(self, prompts, completions, completion_ids, columns)

    def score(self, rollout: Rollout) -> Rollout:
        """Fill `rollout.per_func` `(N, F)` and `rollout.rewards` `(N,)` (in place; returned too).
        With environments (`environment_factory`) every function also gets `environments` (N,),
        as in TRL."""
        r = rollout
        columns = (
            r.columns if r.environments is None else {**r.columns, "environments": r.environments}
        )
        r.per_func = self.score_columns(r.prompts, r.completions, r.completion_ids, columns)
        r.rewards = combine_rewards(r.per_func, self.weights)
        return r
