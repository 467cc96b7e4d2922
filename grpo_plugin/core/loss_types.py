"""The loss types of the GRPO family (`GRPOConfig.loss_type`), one registered definition each.

Adding a loss type is one `register(LossType(...))` here and its row in
`tests/core/test_loss_types.py`: its per-token surrogate (usually a function of
`surrogates.py`), how the masked loss is reduced, the parameters it reads and their checks, what
it needs from sampling, and the name it gives the objective on the model card. Everything that
depends on the loss type reads its definition: `losses.policy_loss` (surrogate, reduction, clip
statistics), `GRPOConfig` (the choices and their help, the warnings and refusals), the trainer's
rescaling of token means over the rollout (`training/objective.py`), whether a rollout copy's
correction applies (`training/sampling/rollouts.py`) and `objectives.objective_name`.

A new numeric parameter is a field of `losses.LossParams` and of `GRPOConfig` (TRL names its
loss parameters as config fields, so ours are fields too), named in `parameters` here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from .surrogates import (
    cispo_surrogate,
    clipped_surrogate,
    sapo_surrogate,
    vespo_gamma_weights,
    vespo_surrogate,
)
from .tensors import masked_mean

# a surrogate and a check read a `losses.LossParams` (not imported: losses imports this module)
LossParams = Any

__all__ = ["LOSS_TYPES", "LossType", "SurrogateTerms", "loss_type", "register"]


class SurrogateTerms(NamedTuple):
    """What a surrogate is given, after the padding is zeroed (all on the policy's dtype)."""

    ratio: torch.Tensor  # (N, T) the importance ratio, per token or the sequence's, broadcast
    log_ratio: torch.Tensor  # (N, T) log pi - log pi_old per token
    logps: torch.Tensor  # (N, T) log pi of each sampled token (with grad)
    adv: torch.Tensor  # (N, 1) one advantage per completion
    weight: torch.Tensor  # (N, T) 1.0 on real completion tokens


Surrogate = Callable[[SurrogateTerms, "LossParams"], tuple[torch.Tensor, dict[str, float]]]
# (masked per-token loss (N, T), weight (N, T), the constant length of "dr_grpo") -> scalar
Reduction = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


@dataclass(frozen=True)
class LossType:
    """One loss type: what `policy_loss`, the config and the trainer need to know of it."""

    name: str
    summary: str  # a few words for GRPOConfig's help, e.g. "per-sequence mean"
    surrogate: Surrogate  # the per-token loss to minimise (N, T), and its own stats
    reduce: Reduction  # the masked (N, T) loss to a scalar
    # a token mean the trainer rescales: "rollout" (the rollout's valid tokens, as TRL's
    # generation batch), "micro_batch" (this micro-batch's tokens on every process); None: none
    token_mean: str | None = None
    sums_over_tokens: bool = False  # one sum over every token: a sequence ratio weights by length
    clipped: bool = False  # PPO's clip: the clip fractions go into the stats
    objective: str | None = None  # the objective's name at token level (model card, logs)
    names_its_objective: bool = False  # ... whatever the importance-sampling level
    paper: str | None = None  # the paper of `objective`
    # the importance_sampling_level it is meant for, and the warning's reason when another is set
    level: tuple[str, str] | None = None
    # why a rollout copy's sampling correction cannot apply (None: it applies)
    correction_refused: str | None = None
    parameters: tuple[str, ...] = ()  # the LossParams / GRPOConfig fields it reads
    check: Callable[[LossParams], None] | None = None  # its parameters' checks


LOSS_TYPES: dict[str, LossType] = {}


def register(definition: LossType) -> LossType:
    if definition.name in LOSS_TYPES:
        raise ValueError(f"loss type {definition.name!r} is registered twice")
    LOSS_TYPES[definition.name] = definition
    return definition


def loss_type(name: str) -> LossType:
    """The definition of `name`; a ValueError naming the choices when there is none."""
    if name not in LOSS_TYPES:
        choices = ", ".join(repr(a) for a in LOSS_TYPES)
        raise ValueError(f"loss_type must be one of {choices}; got {name!r}.")
    return LOSS_TYPES[name]


# --- reductions ---------------------------------------------------------------------------------
def sequence_mean(masked_loss: torch.Tensor, weight: torch.Tensor, max_len: int) -> torch.Tensor:
    """Each sequence's mean, then the mean (DeepSeekMath eq. 3, https://arxiv.org/abs/2402.03300)."""
    lengths = weight.sum(dim=-1).clamp(min=1)  # (N,)
    return (masked_loss.sum(dim=-1) / lengths).mean()


def token_mean(masked_loss: torch.Tensor, weight: torch.Tensor, max_len: int) -> torch.Tensor:
    """The mean over every valid token (DAPO section 3.3, https://arxiv.org/abs/2503.14476)."""
    return masked_loss.sum() / weight.sum().clamp(min=1)


def constant_length(masked_loss: torch.Tensor, weight: torch.Tensor, max_len: int) -> torch.Tensor:
    """The sum over a constant N * max_len (Dr. GRPO, https://arxiv.org/abs/2503.20783)."""
    return masked_loss.sum() / (masked_loss.shape[0] * max_len)


def sequence_sum(masked_loss: torch.Tensor, weight: torch.Tensor, max_len: int) -> torch.Tensor:
    """Each sequence's SUM, then the mean (LUSPO, https://arxiv.org/abs/2602.05261: GSPO scaled
    by the length)."""
    return masked_loss.sum(dim=-1).mean()


# --- surrogates ---------------------------------------------------------------------------------
def _clipped(t: SurrogateTerms, p: LossParams) -> tuple[torch.Tensor, dict[str, float]]:
    return clipped_surrogate(t.ratio, t.adv, p.epsilon_low, p.eps_high, p.delta), {}


def _cispo(t: SurrogateTerms, p: LossParams) -> tuple[torch.Tensor, dict[str, float]]:
    stats = {"cispo_clip_ratio": masked_mean((t.ratio > p.eps_high) & (t.adv > 0), t.weight)}
    return cispo_surrogate(t.ratio, t.logps, t.adv, p.eps_high), stats


def _sapo(t: SurrogateTerms, p: LossParams) -> tuple[torch.Tensor, dict[str, float]]:
    return sapo_surrogate(t.ratio, t.adv, p.sapo_temperature_pos, p.sapo_temperature_neg), {}


def _vespo(t: SurrogateTerms, p: LossParams) -> tuple[torch.Tensor, dict[str, float]]:
    k_lambda = (p.vespo_k_pos, p.vespo_lambda_pos, p.vespo_k_neg, p.vespo_lambda_neg)
    phi = vespo_gamma_weights(t.log_ratio, t.weight, t.adv, k_lambda)  # (N, 1), detached
    return vespo_surrogate(phi, t.logps, t.adv), {"vespo/phi_seq_mean": phi.mean().item()}


def _check_sapo(p: LossParams) -> None:
    for name in ("sapo_temperature_pos", "sapo_temperature_neg"):
        if not getattr(p, name) > 0:
            raise ValueError(f"{name}={getattr(p, name)} must be > 0.")


# --- the loss types -----------------------------------------------------------------------------
CLIP = ("epsilon_low", "epsilon_high", "delta")
register(
    LossType("grpo", "per-sequence mean", _clipped, sequence_mean, clipped=True, parameters=CLIP)
)
register(
    LossType(
        "dapo",
        "per-token over the rollout",
        _clipped,
        token_mean,
        token_mean="rollout",
        sums_over_tokens=True,
        clipped=True,
        objective="DAPO",
        paper="https://arxiv.org/abs/2503.14476",  # Yu et al., 2025
        parameters=CLIP,
    )
)
register(
    LossType(
        "dr_grpo",
        "sum / (N * max_completion_length)",
        _clipped,
        constant_length,
        sums_over_tokens=True,
        clipped=True,
        objective="Dr. GRPO",
        paper="https://arxiv.org/abs/2503.20783",  # Liu et al., 2025
        parameters=CLIP + ("max_completion_length",),
    )
)
register(
    LossType(
        "bnpo",
        "per-token over the micro-batch",
        _clipped,
        token_mean,
        token_mean="micro_batch",
        sums_over_tokens=True,
        clipped=True,
        parameters=CLIP,
    )
)
register(
    LossType(
        "luspo",
        "sequence sums",
        _clipped,
        sequence_sum,
        clipped=True,
        objective="LUSPO",
        names_its_objective=True,
        paper="https://arxiv.org/abs/2602.05261",  # Length-Unbiased Sequence PO, 2026
        level=(
            "sequence",
            "is a sequence-level loss: set importance_sampling_level='sequence' to match the "
            "LUSPO paper",
        ),
        parameters=CLIP,
    )
)
register(
    LossType(
        "cispo",
        "clipped importance-sampling weights",
        _cispo,
        token_mean,
        token_mean="rollout",
        sums_over_tokens=True,
        objective="CISPO",
        names_its_objective=True,
        paper="https://arxiv.org/abs/2506.13585",  # MiniMax-M1, 2025
        parameters=("epsilon_high",),
    )
)
register(
    LossType(
        "sapo",
        "a smooth gate instead of the clip",
        _sapo,
        sequence_mean,
        objective="SAPO",
        names_its_objective=True,
        paper="https://arxiv.org/abs/2511.20347",  # Soft Adaptive Policy Optimization, 2025
        parameters=("sapo_temperature_pos", "sapo_temperature_neg"),
        check=_check_sapo,
    )
)
register(
    LossType(
        "vespo",
        "variational sequence-level weights",
        _vespo,
        token_mean,
        token_mean="rollout",
        sums_over_tokens=True,
        objective="VESPO",
        names_its_objective=True,
        paper="https://arxiv.org/abs/2602.10693",  # Variational Sequence-level Soft PO, 2026
        level=(
            "token",
            "builds its own sequence-level weight from token log-ratios; leave "
            "importance_sampling_level='token'",
        ),
        correction_refused="VESPO folds the sampling ratio into its own sequence weights",
        parameters=("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"),
    )
)
