"""The run's reward sources, resolved once: what `GRPOTrainer(reward_funcs=...)` turns into.

Functions, registered names, `module:function` paths and reward models (`reward_models.py`) become
callables that receive the trainer kwargs they declare (`scoring/context.py`), with their weights
`(F,)` and metric names. `score` fills a rollout's rewards and gives TRL's warning when no function
scored a completion.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

import reward_fns

from ..config.number_checks import check_reward_weights
from ..rollout.types import Rollout
from .context import RewardContext, warn_if_unscored
from .reward_models import is_reward_model, place_reward_models, resolve_reward_funcs
from .scorer import RewardChecks, RewardScorer


@dataclass
class RewardSources:
    """Every reward of a run, in `reward_funcs` order."""

    funcs: list[Callable]  # as given (reward models loaded); trainer kwargs added at each call
    names: list[str]  # `rewards/<name>/mean`: a function's name, a reward model's model name
    weights: torch.Tensor  # (F,)
    processing_classes: list[Any]  # each reward model's tokenizer, None for a function
    context: RewardContext  # trainer_state, log_extra, log_metric
    checks: RewardChecks = RewardChecks()  # time limit per call, NaN policy

    @classmethod
    def resolve(
        cls,
        reward_funcs: Any,
        processing_classes: Any,
        args: Any,
        init_kwargs: dict[str, Any],
        context: RewardContext,
        extra: list[Callable] = (),
    ) -> RewardSources:
        """Resolve `reward_funcs` (loading reward models with `init_kwargs`) and check the weights
        (`args.reward_weights`). `extra` rewards (environments' `get_reward`) come last, with
        weight 1 each, as in TRL; with them `reward_funcs` may be None."""
        # all-zero weights learn nothing, unless environments' rewards (weight 1) are learned
        check_reward_weights(args.reward_weights, all_zero_ok=bool(extra))
        given = reward_funcs is not None or not extra
        funcs = resolve_reward_funcs(reward_funcs, processing_classes, init_kwargs) if given else []
        weights = reward_weight_tensor(args.reward_weights, len(funcs)) if funcs else torch.ones(0)
        funcs += list(extra)
        return cls(
            funcs=funcs,
            names=[reward_fns.reward_name(f) for f in funcs],
            weights=torch.cat([weights, torch.ones(len(extra))]),
            processing_classes=[getattr(f, "tokenizer", None) for f in funcs],
            context=context,
            checks=RewardChecks.from_args(args),
        )

    @property
    def scorer(self) -> RewardScorer:
        """The run's scorer: every function, the weights, the run's checks and trainer kwargs."""
        return RewardScorer(tuple(self.funcs), self.weights, self.checks, self.context)

    def place(self, device: torch.device | str, chat_template_kwargs: dict | None) -> None:
        """Reward models onto the policy's device, rendering chats as the policy's prompts are."""
        place_reward_models(self.funcs, device, chat_template_kwargs)

    def score(self, rollout: Rollout) -> Rollout:
        """Fill `rollout.per_func` `(N, F)` and `rollout.rewards` `(N,)`; warn about completions no
        function scored (their advantage is 0)."""
        self.scorer.score(rollout)
        warn_if_unscored(rollout)
        return rollout

    def model_sources(self) -> dict[str, str]:
        """`{name: model id or path}` of the rewards that are reward models (for the model card)."""
        return {n: f.source for n, f in zip(self.names, self.funcs) if is_reward_model(f)}


def reward_weight_tensor(weights: list[float] | None, num_funcs: int) -> torch.Tensor:
    weights = weights or [1.0] * num_funcs
    if len(weights) != num_funcs:
        raise ValueError(
            f"Number of reward weights ({len(weights)}) must match number of reward functions "
            f"({num_funcs}): give reward_weights one weight per function."
        )
    return torch.tensor(weights, dtype=torch.float32)
