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


class RolloutDriftError(RuntimeError):
    """The vLLM engine's samples do not come from the policy's current weights; names the step."""


DRIFT_METRIC = "sampling/sampling_logp_difference/mean"


def check_rollout_drift(metrics: dict[str, float], limit: float | None, step: int) -> None:
    """The sync check of `use_vllm`: a micro-batch's mean |log pi_policy - log pi_vllm| over its
    sampled tokens (`metrics[DRIFT_METRIC]`, from the sampling correction) above `limit`."""
    drift = metrics.get(DRIFT_METRIC)
    if limit is None or drift is None or drift <= limit:
        return
    raise RolloutDriftError(
        f"step {step + 1}: vLLM's samples have log-probs {drift:.3g} nats per token away from "
        f"the policy's on the same tokens (vllm_max_logp_drift={limit:g}): the engine is not "
        "sampling from the policy's current weights (a weight sync that did not happen, or the "
        "adapter missing from the served weights). Stopped before the optimizer step, so "
        "nothing of this step was trained; the checkpoints are kept."
    )


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
