"""Token and sequence masks that take terms out of the policy loss (the KL term is never masked).

- ``high_entropy_mask``: "Beyond the 80/20 Rule" (https://arxiv.org/abs/2506.01939) keeps only the
  top-rho quantile of tokens by entropy (TRL's ``top_entropy_quantile``).
- ``off_policy_mask``: DeepSeek-V3.2's off-policy sequence masking (https://arxiv.org/abs/2512.02556,
  eq. 9; TRL's ``off_policy_mask_threshold``).
"""

from __future__ import annotations

import torch

__all__ = ["high_entropy_mask", "off_policy_mask"]


@torch.no_grad()
def high_entropy_mask(
    entropies: torch.Tensor,
    mask: torch.Tensor,
    top_quantile: float,
    pool: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(N, T)`` bool: the valid tokens whose entropy is in the top ``top_quantile`` of the batch.

    The threshold is ``torch.quantile`` (linear interpolation) at ``1 - top_quantile`` over the
    valid tokens' entropies, and a token is kept when its entropy is ``>=`` it; so ``1.0`` keeps
    every valid token and ``0.0`` only the highest. As TRL, the quantile is taken over one
    micro-batch: the tokens passed in, or ``pool`` ``(M,)`` when given (TRL gathers every
    process's valid entropies; the trainer passes them here).
    """
    if not 0.0 <= top_quantile <= 1.0:
        raise ValueError(f"top_quantile={top_quantile} must be in [0, 1].")
    valid = mask.bool()  # (N, T)
    values = (entropies[valid] if pool is None else pool).float()  # (M,)
    if values.numel() == 0:
        return torch.zeros_like(valid)
    threshold = torch.quantile(values, 1.0 - top_quantile)
    return (entropies.float() >= threshold) & valid


@torch.no_grad()
def off_policy_mask(
    advantages: torch.Tensor,
    logps: torch.Tensor,
    behaviour_logps: torch.Tensor,
    mask: torch.Tensor,
    threshold: float,
) -> torch.Tensor:
    """``(N, 1)`` float: 0 for a sequence with ``A < 0`` whose mean ``log pi_old - log pi`` exceeds
    ``threshold``, 1 otherwise.

    The mean runs over the valid tokens only (padding values are ignored, NaN counts as 0), and the
    KL estimate is the sampled-token one of the paper: ``mean_t (log pi_old - log pi_theta)``.
    """
    valid = mask.to(logps.dtype)  # (N, T)
    gap = torch.nan_to_num(behaviour_logps - logps.detach(), nan=0.0) * valid  # (N, T)
    seq_kl = gap.sum(dim=-1, keepdim=True) / valid.sum(dim=-1, keepdim=True).clamp(min=1.0)
    keep = (advantages.reshape(-1, 1) >= 0) | (seq_kl <= threshold)  # (N, 1)
    return keep.to(logps.dtype)
