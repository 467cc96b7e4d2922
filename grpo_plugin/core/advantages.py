"""Group-relative advantages: one row of G rewards per prompt in, one advantage per completion out.

- ``group_advantages``: GRPO's group whitening and its variants (Dr. GRPO, RLOO, batch std).
- ``decoupled_advantages``: TRL's ``multi_objective_aggregation="normalize_then_sum"`` (GDPO):
  each reward function is whitened within its group before the weighted sum, and the sum is then
  whitened over the whole batch.

Where we depart from TRL (https://github.com/huggingface/trl, ``GRPOTrainer``), on purpose:

- The std is the *population* std (DeepSeekMath 4.1.2: "normalized by the group's standard
  deviation") with ``eps = 1e-8``; TRL uses the unbiased std with ``eps = 1e-4``. A std ``<= eps``
  gives exactly 0 advantage, so float noise in a near-uniform group is never amplified.
- A ``NaN`` reward means "not scored": it is left out of its group's statistics and gets advantage
  0, and a group with fewer than two scored rewards gets all zeros (TRL's ``nanmean``/``nanstd``
  leaves NaN advantages for unscored completions).
"""

from __future__ import annotations

import torch

__all__ = ["ESTIMATORS", "decoupled_advantages", "group_advantages"]

ESTIMATORS = ("grpo", "dr_grpo", "rloo", "batch")


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        choices = ", ".join(repr(a) for a in allowed)
        raise ValueError(f"{name} must be one of {choices}; got {value!r}.")


def group_advantages(
    rewards: torch.Tensor, estimator: str = "grpo", eps: float = 1e-8
) -> torch.Tensor:
    """Advantage of every completion relative to its group (one group per row).

    Args:
        rewards: ``(P, G)`` rewards, one row per prompt; ``NaN`` marks a completion not scored.
        estimator: ``"grpo"`` (DeepSeekMath 4.1.2, population std), ``"dr_grpo"`` (centred only),
            ``"rloo"`` (leave-one-out mean) or ``"batch"`` (group mean, batch-wide std).
        eps: added to the std; a std ``<= eps`` gives zero advantages.

    Returns:
        ``(P, G)`` advantages in the dtype of ``rewards`` (float64 arithmetic inside). Unscored
        entries, and rows with fewer than two scored rewards, are exactly 0.
    """
    _check_choice("estimator", estimator, ESTIMATORS)
    rewards = torch.as_tensor(rewards)
    if rewards.dim() != 2:
        raise ValueError(
            f"rewards must be 2-D (num_prompts, group_size); got shape {tuple(rewards.shape)}. "
            "Reshape a flat batch with rewards.view(-1, group_size)."
        )
    if estimator == "rloo" and rewards.shape[1] < 2:
        raise ValueError(
            f"estimator='rloo' needs a group size of at least 2 (num_generations >= 2); "
            f"got rewards of shape {tuple(rewards.shape)}."
        )
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype()
    r = rewards.to(torch.float64)  # (P, G)
    scored = ~torch.isnan(r)  # (P, G)
    r0 = torch.where(scored, r, torch.zeros_like(r))  # (P, G) NaN -> 0
    count = scored.sum(dim=1, keepdim=True).to(torch.float64)  # (P, 1)
    mean = r0.sum(dim=1, keepdim=True) / count.clamp(min=1)  # (P, 1)
    centred = torch.where(scored, r0 - mean, torch.zeros_like(r0))  # (P, G)

    if estimator == "grpo":
        var = (centred**2).sum(dim=1, keepdim=True) / count.clamp(min=1)  # (P, 1)
        adv = _scale_by_std(centred, var.sqrt(), eps)
    elif estimator == "dr_grpo":
        adv = centred
    elif estimator == "rloo":
        peer_mean = (r0.sum(dim=1, keepdim=True) - r0) / (count - 1).clamp(min=1)  # (P, G)
        adv = r0 - peer_mean
    else:  # "batch"
        n_scored = count.sum().clamp(min=1)
        batch_mean = r0.sum() / n_scored
        batch_var = (
            torch.where(scored, r0 - batch_mean, torch.zeros_like(r0)) ** 2
        ).sum() / n_scored
        adv = _scale_by_std(centred, batch_var.sqrt(), eps)

    keep = scored & (count >= 2)  # (P, G)
    return torch.where(keep, adv, torch.zeros_like(adv)).to(out_dtype)


def _scale_by_std(centred: torch.Tensor, std: torch.Tensor, eps: float) -> torch.Tensor:
    """``centred / (std + eps)``, or exactly 0 where ``std <= eps``."""
    return torch.where(std > eps, centred / (std + eps), torch.zeros_like(centred))


def decoupled_advantages(
    per_func: torch.Tensor, weights: torch.Tensor, eps: float = 1e-8
) -> torch.Tensor:
    """GDPO's "normalize, then sum" advantages for several reward functions.

    GDPO (https://arxiv.org/abs/2601.05242), as TRL's ``normalize_then_sum``: every reward function
    is whitened within each group (so a function with a large scale cannot drown the others), the
    weighted sum is taken, and the sum is whitened over the whole batch.

    Args:
        per_func: ``(P, G, F)`` rewards of each of F functions; ``NaN`` = that function did not score.
        weights: ``(F,)`` one weight per function.
        eps: as in ``group_advantages``.

    Returns:
        ``(P, G)`` advantages; a completion no function scored gets exactly 0. A function's unscored
        entries count as 0 in the sum (TRL's ``nansum``), with the std conventions of this module.
    """
    per_func = torch.as_tensor(per_func)
    if per_func.dim() != 3 or per_func.shape[-1] != len(weights):
        raise ValueError(
            f"per_func must have shape (P, G, F) with F = len(weights) = {len(weights)}; "
            f"got {tuple(per_func.shape)}."
        )
    p, g, f = per_func.shape
    r = per_func.to(torch.float64)
    per_group = group_advantages(r.permute(0, 2, 1).reshape(p * f, g)).view(p, f, g)  # (P, F, G)
    w = torch.as_tensor(weights, dtype=torch.float64).view(1, f, 1)
    summed = (per_group * w).sum(dim=1)  # (P, G)
    unscored = torch.isnan(r).all(dim=-1)  # (P, G)
    summed = summed.masked_fill(unscored, float("nan")).view(1, p * g)
    return group_advantages(summed, "grpo", eps).view(p, g).to(per_func.dtype)
