"""A scored rollout's advantages: the rewards `(N,)` or `(N, F)` in groups, as the config says.

Training (`training/objective.py`) and evaluation during training (its loss on held-out prompts)
both take them here, so the two read the same estimator. The estimators themselves are pure
tensor functions in `core/advantages.py` (DeepSeekMath section 4.1.2,
https://arxiv.org/abs/2402.03300; GDPO's per-function whitening for
`multi_objective_aggregation="normalize_then_sum"`).
"""

from __future__ import annotations

from typing import Any

import torch

from ..core.advantages import decoupled_advantages, group_advantages
from ..rollout.types import Rollout

__all__ = ["rollout_advantages"]


def rollout_advantages(
    rollout: Rollout, args: Any, weights: torch.Tensor, group_size: int | None = None
) -> torch.Tensor:
    """`(N,)` advantages of a scored rollout in groups of `group_size` (default
    `num_generations`): GDPO's per-function whitening when `multi_objective_aggregation` is
    "normalize_then_sum", else the configured estimator on the weighted sum."""
    group = group_size or args.num_generations
    if args.multi_objective_aggregation == "normalize_then_sum":
        per_func = rollout.per_func.view(-1, group, len(weights))  # (P, G, F)
        return decoupled_advantages(per_func, weights).reshape(-1)
    grouped = rollout.rewards.view(-1, group)  # (P, G)
    return group_advantages(grouped, estimator=args.estimator).reshape(-1)
