"""The correction for sampling from a policy other than the trained one (a cheaper rollout copy).

When completions are sampled from pi_sample (e.g. a bf16 copy of the float32 policy) but the
loss is computed under pi_old (the trained policy when the rollout was made), every per-token
loss term is weighted by the importance ratio rho = pi_old / pi_sample, bounded so that a rare
token the copy over-sampled cannot blow up the gradient:

- truncate (TIS, Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
  Training", https://fengyao.notion.site/off-policy-rl): rho <- clamp(rho, clip_min, clip_max);
- mask (MIS, Liu et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from the
  Training-Inference Mismatch"): rho <- 0 outside [clip_min, clip_max];
- per token (`token_*`, `(N, T)` weights) or per sequence (`sequence_*`, `(N, 1)`: rho is the
  product of the token ratios, exp of the summed log-ratio).

The same four modes, bounds and defaults as TRL 1.16's `vllm_importance_sampling_*` (which
applies them to vLLM's log-probs); the weights are constants (no gradient flows through them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

CORRECTION_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@dataclass(frozen=True)
class CorrectionParams:
    """How the importance ratio is bounded: TRL's `vllm_importance_sampling_*` settings."""

    mode: str = "sequence_mask"  # one of CORRECTION_MODES
    clip_min: float | None = None  # lower bound (None: none)
    clip_max: float | None = 3.0  # upper bound (None: none)

    def __post_init__(self) -> None:
        if self.mode not in CORRECTION_MODES:
            raise ValueError(
                f"sampling_correction_mode={self.mode!r} is not supported; use one of "
                f"{', '.join(CORRECTION_MODES)} (TRL's vllm_importance_sampling_mode)."
            )
        low = 0.0 if self.clip_min is None else self.clip_min
        high = math.inf if self.clip_max is None else self.clip_max
        if not 0 <= low < high:
            raise ValueError(
                f"sampling_correction_clip_min={self.clip_min} and sampling_correction_clip_max="
                f"{self.clip_max} must satisfy 0 <= clip_min < clip_max (defaults: None, 3.0)."
            )

    @property
    def per_sequence(self) -> bool:
        return self.mode.startswith("sequence")


@torch.no_grad()
def sampling_weights(
    old_logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    mask: torch.Tensor,
    params: CorrectionParams,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The importance weights of `N` completions and their diagnostics.

    Args:
        old_logps: `(N, T)` log-probs of the sampled tokens under the trained policy.
        sampling_logps: `(N, T)` the same under the policy that sampled them (NaN: unknown,
            treated as no mismatch, as TRL does).
        mask: `(N, T)` 1 on the tokens the policy sampled (not tool results, not padding).
        params: the mode and bounds.

    Returns:
        `(weights, stats)`: `(N, T)` (token modes) or `(N, 1)` (sequence modes) weights, and
        TRL's `sampling/sampling_logp_difference/{mean,max}` and
        `sampling/importance_sampling_ratio/{min,mean,max}`, plus ours,
        `sampling/importance_sampling_bounded`: the share of tokens (token modes) or sequences
        whose ratio fell outside the bounds and was clamped or zeroed.
    """
    valid = mask.bool()  # (N, T)
    diff = torch.nan_to_num((old_logps.float() - sampling_logps.float()) * valid, nan=0.0)
    log_ratio = diff.sum(-1, keepdim=True) if params.per_sequence else diff  # (N, 1) | (N, T)
    ratio = log_ratio.exp()
    low = -math.inf if params.clip_min is None else params.clip_min
    high = math.inf if params.clip_max is None else params.clip_max
    outside = (ratio < low) | (ratio > high)
    if params.mode.endswith("truncate"):
        weights = ratio.clamp(min=low, max=high)
    else:
        weights = ratio.masked_fill(outside, 0.0)
    counted = valid.any(-1, keepdim=True) if params.per_sequence else valid  # what the stats see
    return weights, _stats(diff.abs()[valid], weights[counted], outside[counted])


def _stats(delta: torch.Tensor, weights: torch.Tensor, outside: torch.Tensor) -> dict[str, float]:
    """The diagnostics over the counted tokens or sequences (0.0 when there are none)."""

    def reduce(x: torch.Tensor, how) -> float:
        return float(how(x)) if x.numel() else 0.0

    return {
        "sampling/sampling_logp_difference/mean": reduce(delta, torch.mean),
        "sampling/sampling_logp_difference/max": reduce(delta, torch.max),
        "sampling/importance_sampling_ratio/min": reduce(weights, torch.min),
        "sampling/importance_sampling_ratio/mean": reduce(weights, torch.mean),
        "sampling/importance_sampling_ratio/max": reduce(weights, torch.max),
        "sampling/importance_sampling_bounded": reduce(outside.float(), torch.mean),
    }
