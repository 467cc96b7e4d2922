"""Stop before a non-finite number reaches the weights.

Checked, in the order a step meets them: the rollout's advantages (after the rewards, which are
already checked one by one in `scoring.py`, but whose group sums can still overflow), each
micro-batch's loss, and the gradient norm before the optimizer step. Each raises
`NonFiniteError` naming the step; since it is raised before `optimizer.step()`, the weights in
memory are the last good ones and no checkpoint of this step is written, so the previous
checkpoints stay intact.
"""

from __future__ import annotations

import math

import torch


class NonFiniteError(FloatingPointError):
    """A NaN or inf where training needs a finite number; the message names the step."""


def check_advantages(advantages: torch.Tensor, rewards: torch.Tensor, step: int) -> None:
    """`advantages` `(N,)` and the rewards `(N,)` (NaN = unscored) they came from."""
    if bool(torch.isfinite(advantages).all()):
        return
    scored = rewards[~torch.isnan(rewards)]
    largest = float(scored.abs().max()) if scored.numel() else math.nan
    raise NonFiniteError(
        f"step {step + 1}: the advantages are not finite (largest |reward| {largest:.3g}); "
        "rewards that large overflow float32 in the group statistics: rescale them, e.g. to [0, 1]."
    )


def check_loss(loss: torch.Tensor, step: int) -> None:
    if not bool(torch.isfinite(loss.detach())):
        raise NonFiniteError(
            f"step {step + 1}: the loss is {float(loss):g}; stopping before the optimizer step so "
            "the weights stay finite. Check the rewards and lower learning_rate; with "
            "importance_sampling_level='sequence' or large epsilon_high, ratios can overflow."
        )


def check_grad_norm(grad_norm: float | torch.Tensor | None, step: int) -> None:
    if grad_norm is not None and not math.isfinite(float(grad_norm)):
        raise NonFiniteError(
            f"step {step + 1}: the gradient norm is {float(grad_norm):g}; stopping before the "
            "optimizer step so the weights stay finite. Lower learning_rate, or keep "
            "max_grad_norm > 0 (gradient clipping)."
        )
