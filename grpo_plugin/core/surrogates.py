"""Per-token surrogate losses of the GRPO family (to minimise), before masking and normalization.

Every function takes ``(N, T)`` tensors (the importance ratio already broadcast per token) and an
``(N, 1)`` advantage, and returns the ``(N, T)`` per-token loss. ``losses.policy_loss`` picks one by
``loss_type``, then masks, adds the KL term and normalizes. Each follows TRL 1.16's
``GRPOTrainer._compute_loss``; where TRL departs from its paper, the docstring says so.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "cispo_surrogate",
    "clipped_surrogate",
    "sapo_surrogate",
    "vespo_gamma_weights",
    "vespo_surrogate",
]


def _by_sign(cond: torch.Tensor, if_true: float, if_false: float, dtype) -> torch.Tensor:
    """`if_true` where `cond`, else `if_false`, in `dtype` (no float32 rounding of the values)."""
    return torch.where(
        cond, cond.new_tensor(if_true, dtype=dtype), cond.new_tensor(if_false, dtype=dtype)
    )


def clipped_surrogate(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
    delta: float | None = None,
) -> torch.Tensor:
    """PPO's clipped objective, negated: ``-min(rho * A, clip(rho, 1 - el, 1 + eh) * A)``.

    PPO eq. 7 (https://arxiv.org/abs/1707.06347) with DAPO's decoupled bounds
    (https://arxiv.org/abs/2503.14476). ``delta`` is INTELLECT-2's two-sided clipping
    (https://arxiv.org/abs/2505.07291): the unclipped ratio is also capped at ``delta``, so a token
    with ``A < 0`` and a huge ratio contributes at most ``-delta * A`` (and no gradient) instead of
    an unbounded term.
    """
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    if delta is not None:
        ratio = torch.clamp(ratio, max=delta)
    return -torch.minimum(ratio * adv, clipped * adv)


def cispo_surrogate(
    ratio: torch.Tensor, logps: torch.Tensor, adv: torch.Tensor, epsilon_high: float
) -> torch.Tensor:
    """CISPO (MiniMax-M1, https://arxiv.org/abs/2506.13585): ``-sg(min(rho, eps_max)) * A * log pi``.

    The importance weight is clipped and detached, so every token keeps a gradient (PPO's clip
    zeroes it). As TRL, ``eps_max`` is ``epsilon_high`` (ScaleRL recommends 5.0) and there is no
    lower clip; the paper's ``1 - eps_low`` bound is not applied.
    """
    weight = torch.clamp(ratio, max=epsilon_high).detach()
    return -weight * adv * logps


def sapo_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, temperature_pos: float, temperature_neg: float
) -> torch.Tensor:
    """SAPO (https://arxiv.org/abs/2511.20347): a smooth gate instead of the hard clip.

    ``-sigmoid(tau * (rho - 1)) * 4 / tau * A`` with ``tau = temperature_pos`` where ``A > 0`` and
    ``temperature_neg`` otherwise. Its gradient ``4 sigma(1 - sigma) rho A`` equals the unclipped
    one at ``rho = 1`` and fades smoothly as ``rho`` leaves 1.
    """
    tau = _by_sign(adv > 0, temperature_pos, temperature_neg, ratio.dtype)  # (N, 1)
    return -torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau * adv


@torch.no_grad()
def vespo_gamma_weights(
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    adv: torch.Tensor,
    k_lambda: tuple[float, float, float, float] = (2.0, 3.0, 3.0, 2.0),
) -> torch.Tensor:
    """VESPO's detached sequence weight ``phi(w) = exp(lambda) * w**k * exp(-lambda * w)`` ``(N, 1)``.

    VESPO (https://arxiv.org/abs/2602.10693): ``w`` is the *sequence* importance ratio
    ``exp(sum_t log rho_t)`` (a product, not GSPO's geometric mean) and ``phi(1) = 1``. As TRL:
    per-token log-ratios are clamped to ``[-20, 20]``, ``log w`` to ``[log 1e-8, 20]``, ``(k,
    lambda)`` are picked by the sign of ``A`` (``A >= 0``: the ``_pos`` pair); ``k_lambda`` is
    ``(k_pos, lambda_pos, k_neg, lambda_neg)``, TRL's ``vespo_*`` fields in that order, and a non-finite
    ``phi`` becomes 0.
    """
    k_pos, lambda_pos, k_neg, lambda_neg = k_lambda
    lower = math.log(1e-8)
    seq_log_ratio = (log_ratio.clamp(-20.0, 20.0) * mask).sum(dim=-1, keepdim=True)  # (N, 1)
    log_w = seq_log_ratio.clamp(lower, 20.0)
    nonneg = adv >= 0  # (N, 1)
    k = _by_sign(nonneg, k_pos, k_neg, log_w.dtype)
    lam = _by_sign(nonneg, lambda_pos, lambda_neg, log_w.dtype).clamp(min=1e-4)
    log_phi = lam + k * log_w - lam * torch.exp(log_w)
    return torch.exp(log_phi).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def vespo_surrogate(phi: torch.Tensor, logps: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
    """VESPO's loss ``-phi(w) * A * log pi`` with ``phi`` from ``vespo_gamma_weights`` (detached)."""
    return -phi * adv * logps
