"""The GRPO family of objectives: pure torch functions over tensors (no model, no trainer).

Each function implements one published equation (DeepSeekMath is GRPO's paper,
https://arxiv.org/abs/2402.03300; PPO is https://arxiv.org/abs/1707.06347):

- ``group_advantages``: group-relative advantages, DeepSeekMath section 4.1.2 ("outcome
  supervision": each reward minus its group's mean, over the group's std; ``"grpo"``); without
  the std scaling (``"dr_grpo"``, Dr. GRPO section 3.1, https://arxiv.org/abs/2503.20783); the
  leave-one-out baseline (``"rloo"``, https://arxiv.org/abs/2402.14740); group mean over the
  batch-wide std (``"batch"``).
- ``kl_k3``: the k3 estimator of KL(pi || pi_ref), DeepSeekMath eq. 4 (Schulman,
  http://joschu.net/blog/kl-approx.html).
- ``policy_loss``: DeepSeekMath eq. 3: the importance ratio (PPO eq. 6, per token; or one
  length-normalised ratio per sequence as in GSPO section 4, https://arxiv.org/abs/2507.18071),
  the clipped surrogate (PPO eq. 7, with DAPO's decoupled "clip-higher" bounds, DAPO section
  3.1, https://arxiv.org/abs/2503.14476), the k3 penalty, and one of three length
  normalizations: per-sequence mean (``"grpo"``, eq. 3's 1/|o_i|), token-level mean (``"dapo"``,
  DAPO section 3.3) or a constant ``N * max_completion_length`` (``"dr_grpo"``).

Where this departs from the papers or from TRL (``trl.GRPOTrainer`` 1.16):

- Advantages use the *population* std (numpy's default) and ``eps=1e-8``; TRL uses the unbiased
  std (correction 1) and ``eps=1e-4``. A group whose std is ``<= eps`` gets exactly zero
  advantage, so float noise in a near-uniform group is never amplified.
- A ``NaN`` reward means "not scored": it is left out of its group's statistics and gets advantage
  0, and a group with fewer than two scored rewards gets all zeros (TRL's ``nanmean``/``nanstd``
  leaves NaN advantages for unscored completions).
- ``"dapo"`` divides by the number of valid tokens passed in; TRL divides by the token count of the
  whole generation batch. Scaling across micro-batches is the caller's job.
- Gradients come from autograd; the tests check them with ``torch.autograd.gradcheck`` in float64
  and against hand-derived values for a categorical policy.
- Padding positions (``mask == 0``) are replaced by zeros before any arithmetic, so ``-inf`` or
  ``NaN`` log-probs there never reach the loss or its gradient.
"""

from __future__ import annotations

import torch

__all__ = [
    "ESTIMATORS",
    "IMPORTANCE_SAMPLING_LEVELS",
    "LOSS_TYPES",
    "PAPERS",
    "check_loss_hyperparameters",
    "group_advantages",
    "kl_k3",
    "objective_name",
    "policy_loss",
]

ESTIMATORS = ("grpo", "dr_grpo", "rloo", "batch")
LOSS_TYPES = ("grpo", "dapo", "dr_grpo")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")

PAPERS = {
    "GRPO": "https://arxiv.org/abs/2402.03300",  # DeepSeekMath (Shao et al., 2024)
    "DAPO": "https://arxiv.org/abs/2503.14476",  # Yu et al., 2025
    "Dr. GRPO": "https://arxiv.org/abs/2503.20783",  # Liu et al., 2025
    "GSPO": "https://arxiv.org/abs/2507.18071",  # Zheng et al., 2025
    "RLOO": "https://arxiv.org/abs/2402.14740",  # Ahmadian et al., 2024
}


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        choices = ", ".join(repr(a) for a in allowed)
        raise ValueError(f"{name} must be one of {choices}; got {value!r}.")


# ----------------------------------------------------------------------------- advantages


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


# ----------------------------------------------------------------------------- KL


def kl_k3(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Elementwise k3 estimate of KL(pi || pi_ref) for samples from pi (DeepSeekMath eq. 4).

    ``k3 = exp(d) - d - 1`` with ``d = ref_logps - logps``: never negative, exactly 0 where the
    two are equal, and its expectation under pi is the KL (since E_pi[pi_ref / pi] = 1).
    """
    if logps.shape != ref_logps.shape:
        raise ValueError(
            f"logps and ref_logps must have the same shape; got {tuple(logps.shape)} and "
            f"{tuple(ref_logps.shape)}."
        )
    delta = ref_logps - logps
    return torch.expm1(delta) - delta  # expm1 keeps it accurate (and >= 0) for tiny delta


# ----------------------------------------------------------------------------- policy loss


def policy_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    ref_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str = "grpo",
    importance_sampling_level: str = "token",
    epsilon_low: float = 0.2,
    epsilon_high: float | None = None,
    beta: float = 0.0,
    max_completion_length: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped GRPO-family loss (to minimise) over ``N`` completions of up to ``T`` tokens.

    Args:
        logps: ``(N, T)`` log-prob of each sampled token under the current policy (with grad).
        old_logps: ``(N, T)`` under the behaviour policy; ``None`` means on-policy
            (``logps.detach()``, so the ratio is 1 but its gradient is not 0).
        ref_logps: ``(N, T)`` under the frozen reference; required when ``beta > 0``.
        advantages: ``(N,)`` one advantage per completion.
        mask: ``(N, T)`` 1 (or True) for real completion tokens, 0 for padding.
        loss_type: length normalization, ``"grpo"`` | ``"dapo"`` | ``"dr_grpo"``.
        importance_sampling_level: ``"token"`` (PPO eq. 6) or ``"sequence"`` (GSPO).
        epsilon_low, epsilon_high: clip range ``[1 - epsilon_low, 1 + epsilon_high]``;
            ``epsilon_high=None`` means ``epsilon_low``.
        beta: weight of the k3 KL penalty (omitted when 0).
        max_completion_length: the ``"dr_grpo"`` constant; ``None`` means ``T``.

    Returns:
        ``(loss, stats)``: a scalar tensor, and detached floats ``clip_ratio/low``,
        ``clip_ratio/high``, ``clip_ratio/region``, ``ratio/mean`` (+ ``kl`` if ``ref_logps``).
    """
    epsilon_high = epsilon_low if epsilon_high is None else epsilon_high
    _check_policy_args(
        logps, old_logps, ref_logps, advantages, mask, loss_type, importance_sampling_level
    )
    check_loss_hyperparameters(epsilon_low, epsilon_high, beta, max_completion_length)
    if beta > 0.0 and ref_logps is None:
        raise ValueError(
            f"beta={beta} > 0 needs ref_logps (log-probs under the reference model); "
            "pass ref_logps or set beta=0."
        )

    valid = mask != 0  # (N, T) bool
    weight = valid.to(logps.dtype)  # (N, T)
    logps = _zero_padding(logps, valid)  # (N, T)
    old = logps.detach() if old_logps is None else _zero_padding(old_logps, valid, logps.dtype)
    ratio = _importance_ratio(logps, old, weight, importance_sampling_level)  # (N, T)

    adv = advantages.to(logps.dtype).unsqueeze(-1)  # (N, 1)
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)  # (N, T)
    per_token = -torch.minimum(ratio * adv, clipped * adv)  # (N, T), PPO eq. 7 negated
    kl = None
    if ref_logps is not None:
        kl = kl_k3(logps, _zero_padding(ref_logps, valid, logps.dtype))  # (N, T), 0 on padding
        if beta != 0:
            per_token = per_token + beta * kl

    max_len = logps.shape[1] if max_completion_length is None else max_completion_length
    loss = _normalize(per_token * weight, weight, loss_type, max_len)
    stats = _loss_stats(ratio, adv, weight, kl, epsilon_low, epsilon_high)
    return loss, stats


def _zero_padding(
    x: torch.Tensor, valid: torch.Tensor, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Zero the padding positions so -inf/NaN there cannot reach the loss or the gradient."""
    x = x if dtype is None else x.to(dtype)
    return torch.where(valid, x, torch.zeros_like(x))


def _importance_ratio(
    logps: torch.Tensor, old_logps: torch.Tensor, weight: torch.Tensor, level: str
) -> torch.Tensor:
    """rho per token (PPO eq. 6) or GSPO's length-normalized sequence ratio broadcast to (N, T)."""
    log_ratio = logps - old_logps  # (N, T)
    if level == "sequence":
        lengths = weight.sum(dim=-1, keepdim=True).clamp(min=1)  # (N, 1)
        log_ratio = ((log_ratio * weight).sum(dim=-1, keepdim=True) / lengths).expand_as(logps)
    return torch.exp(log_ratio)  # (N, T)


def _normalize(
    masked_loss: torch.Tensor, weight: torch.Tensor, loss_type: str, max_len: int
) -> torch.Tensor:
    """Reduce the (N, T) masked per-token loss to a scalar (DeepSeekMath eq. 3, DAPO 3.3, Dr. GRPO)."""
    if loss_type == "grpo":  # mean over each sequence's tokens, then over sequences
        lengths = weight.sum(dim=-1).clamp(min=1)  # (N,)
        return (masked_loss.sum(dim=-1) / lengths).mean()
    if loss_type == "dapo":  # token-level mean over the batch
        return masked_loss.sum() / weight.sum().clamp(min=1)
    return masked_loss.sum() / (masked_loss.shape[0] * max_len)  # "dr_grpo": a constant


@torch.no_grad()
def _loss_stats(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    weight: torch.Tensor,
    kl: torch.Tensor | None,
    epsilon_low: float,
    epsilon_high: float,
) -> dict[str, float]:
    """Token-level clip fractions, mean ratio and mean k3 over the valid tokens."""
    n_valid = weight.sum().clamp(min=1)
    low = ((ratio < 1.0 - epsilon_low) & (adv < 0)).to(weight.dtype)  # (N, T)
    high = ((ratio > 1.0 + epsilon_high) & (adv > 0)).to(weight.dtype)  # (N, T)
    low_frac = ((low * weight).sum() / n_valid).item()
    high_frac = ((high * weight).sum() / n_valid).item()
    stats = {
        "clip_ratio/low": low_frac,
        "clip_ratio/high": high_frac,
        "clip_ratio/region": low_frac + high_frac,
        "ratio/mean": ((ratio * weight).sum() / n_valid).item(),
    }
    if kl is not None:
        stats["kl"] = ((kl * weight).sum() / n_valid).item()
    return stats


def _check_policy_args(
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    ref_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str,
    importance_sampling_level: str,
) -> None:
    _check_choice("loss_type", loss_type, LOSS_TYPES)
    _check_choice(
        "importance_sampling_level", importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS
    )
    named = {"logps": logps, "old_logps": old_logps, "ref_logps": ref_logps}
    named.update({"advantages": advantages, "mask": mask})
    for name, value in named.items():
        if value is not None and not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor; got {type(value).__name__}.")
    if logps.dim() != 2 or logps.shape[0] == 0:
        raise ValueError(
            f"logps must have shape (N, T) with N >= 1 (one row per completion); "
            f"got {tuple(logps.shape)}."
        )
    if not logps.is_floating_point():
        raise TypeError(f"logps must be a floating-point tensor; got dtype {logps.dtype}.")
    for name in ("old_logps", "ref_logps", "mask"):
        if named[name] is not None and named[name].shape != logps.shape:
            raise ValueError(
                f"{name} must have the same shape as logps {tuple(logps.shape)}; "
                f"got {tuple(named[name].shape)}."
            )
    if advantages.shape != logps.shape[:1]:
        raise ValueError(
            f"advantages must have shape (N,) = ({logps.shape[0]},), one per completion; got "
            f"{tuple(advantages.shape)}. Flatten group advantages with advantages.reshape(-1)."
        )


def check_loss_hyperparameters(
    epsilon_low: float,
    epsilon_high: float | None,
    beta: float,
    max_completion_length: int | None = None,
) -> None:
    """The one home of these checks: `policy_loss` and `GRPOConfig` both call it.

    `GRPOConfig` names: `epsilon` (= epsilon_low), `epsilon_high`, `beta`, `max_completion_length`.
    """
    if not 0.0 < epsilon_low < 1.0:
        raise ValueError(
            f"epsilon={epsilon_low} (the lower clip epsilon) must be in (0, 1); 0.2 is the usual value."
        )
    if epsilon_high is not None and not epsilon_high > 0.0:
        raise ValueError(
            f"epsilon_high={epsilon_high} must be > 0 (DAPO uses 0.28), or None to reuse epsilon."
        )
    if not beta >= 0.0:
        raise ValueError(f"beta={beta} must be >= 0 (0 disables the KL penalty).")
    if max_completion_length is not None and max_completion_length < 1:
        raise ValueError(
            f"max_completion_length={max_completion_length} must be a positive int (or None "
            "in policy_loss, then T is used)."
        )


# ----------------------------------------------------------------------------- naming


def objective_name(loss_type: str, importance_sampling_level: str, estimator: str) -> str:
    """Name of the objective a configuration amounts to, for logs and model cards.

    Precedence: the ``"rloo"`` estimator gives ``"RLOO"``; a sequence-level ratio ``"GSPO"``;
    ``loss_type="dapo"`` ``"DAPO"``; ``loss_type`` or estimator ``"dr_grpo"`` ``"Dr. GRPO"``;
    anything else ``"GRPO"``. ``PAPERS[name]`` is the paper's arXiv link.
    """
    _check_choice("loss_type", loss_type, LOSS_TYPES)
    _check_choice(
        "importance_sampling_level", importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS
    )
    _check_choice("estimator", estimator, ESTIMATORS)
    if estimator == "rloo":
        return "RLOO"
    if importance_sampling_level == "sequence":
        return "GSPO"
    if loss_type == "dapo":
        return "DAPO"
    if "dr_grpo" in (loss_type, estimator):
        return "Dr. GRPO"
    return "GRPO"
