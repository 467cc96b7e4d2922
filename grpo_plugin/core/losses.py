"""The GRPO-family policy loss: importance ratio -> per-token surrogate -> masks -> KL -> normalization.

``policy_loss`` is a pure function of ``(N, T)`` tensors and a ``LossParams``; each loss type's
surrogate and reduction are its registered definition (``loss_types.py``), the per-token
surrogates live in ``surrogates.py`` and the masks in ``masks.py``. It follows TRL 1.16's
``GRPOTrainer._compute_loss`` except where this docstring says otherwise:

- ``"dapo"``, ``"cispo"`` and ``"vespo"`` divide by the number of valid tokens passed in; TRL divides
  by the token count of the whole generation batch. Scaling across micro-batches and processes is
  the caller's job (``training/objective.py``). ``"bnpo"`` is the same reduction over one
  micro-batch, as in TRL (the caller rescales it to the micro-batch's count over every process).
- Padding positions (``mask == 0``) are replaced by zeros before any arithmetic, so ``-inf`` or
  ``NaN`` log-probs there never reach the loss or its gradient.
- Gradients come from autograd; the tests check them with ``torch.autograd.gradcheck`` in float64
  and against hand-derived values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .loss_types import LOSS_TYPES, SurrogateTerms, loss_type
from .masks import off_policy_mask
from .tensors import masked_mean

__all__ = [
    "IMPORTANCE_SAMPLING_LEVELS",
    "LOSS_TYPES",
    "LossInputs",
    "LossParams",
    "check_loss_hyperparameters",
    "kl_k3",
    "policy_loss",
]

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        choices = ", ".join(repr(a) for a in allowed)
        raise ValueError(f"{name} must be one of {choices}; got {value!r}.")


@dataclass(frozen=True)
class LossParams:
    """The loss hyperparameters, validated once (TRL's ``GRPOConfig`` names in brackets).

    ``epsilon_low`` (``epsilon``) and ``epsilon_high`` bound the clip; ``epsilon_high=None`` means
    ``epsilon_low``. ``max_completion_length`` is ``"dr_grpo"``'s constant (None: T). ``delta``
    caps the ratio from above (two-sided clipping). ``use_bias_correction_kl`` multiplies the k3
    term by the importance ratio (off here: DeepSeekMath's k3; ``GRPOConfig`` follows TRL: on). ``off_policy_mask_threshold`` drops negative-advantage sequences
    that drifted too far from the behaviour policy. ``sapo_*`` and ``vespo_*`` belong to those
    loss types.
    """

    loss_type: str = "grpo"
    importance_sampling_level: str = "token"
    epsilon_low: float = 0.2
    epsilon_high: float | None = None
    beta: float = 0.0
    max_completion_length: int | None = None
    delta: float | None = None
    use_bias_correction_kl: bool = False
    off_policy_mask_threshold: float | None = None
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0

    def __post_init__(self) -> None:
        loss_type(self.loss_type)  # a registered one, or the choices in one line
        _check_choice(
            "importance_sampling_level", self.importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS
        )
        check_loss_hyperparameters(
            self.epsilon_low,
            self.epsilon_high,
            self.beta,
            self.max_completion_length,
            self.delta,
            self.off_policy_mask_threshold,
        )
        for definition in LOSS_TYPES.values():  # the fields exist whichever loss is chosen
            if definition.check is not None:
                definition.check(self)

    @property
    def eps_high(self) -> float:
        return self.epsilon_low if self.epsilon_high is None else self.epsilon_high


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


class LossInputs(NamedTuple):
    """The tensors of `policy_loss`, in its former positional order (`LossInputs(logps, None,
    None, advantages, mask)` is on-policy without a reference)."""

    logps: torch.Tensor  # (N, T) each sampled token's log-prob under the policy (with grad)
    old_logps: torch.Tensor | None  # (N, T) under the behaviour policy; None: on-policy
    ref_logps: torch.Tensor | None  # (N, T) under the frozen reference; needed when beta > 0
    advantages: torch.Tensor  # (N,) one advantage per completion
    mask: torch.Tensor  # (N, T) 1 on real completion tokens: the normalizer
    token_mask: torch.Tensor | None = None  # (N, T) an extra mask on the policy term only
    sampling_weights: torch.Tensor | None = None  # (N, T) | (N, 1) constant policy-term weights


def policy_loss(
    inputs: LossInputs, params: LossParams | None = None, **settings
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO-family loss (to minimise) over ``N`` completions of up to ``T`` tokens.

    Args (the fields of ``inputs``, a ``LossInputs``; then ``params``):
        logps: ``(N, T)`` log-prob of each sampled token under the current policy (with grad).
        old_logps: ``(N, T)`` under the behaviour policy; ``None`` means on-policy
            (``logps.detach()``, so the ratio is 1 but its gradient is not 0).
        ref_logps: ``(N, T)`` under the frozen reference; required when ``beta > 0``.
        advantages: ``(N,)`` one advantage per completion.
        mask: ``(N, T)`` 1 (or True) for real completion tokens, 0 for padding; the normalizer.
        params: the hyperparameters; or pass ``LossParams`` fields as keyword ``settings``.
        token_mask: ``(N, T)`` optional extra mask on the policy term only (e.g. the high-entropy
            mask); the KL term and the normalization still use ``mask``.
        sampling_weights: ``(N, T)`` or ``(N, 1)`` optional constant weights on the policy term
            (not the KL term): ``sampling_correction.sampling_weights`` when a cheaper copy of the
            policy sampled the rollout (where TRL applies its vLLM correction).

    Returns:
        ``(loss, stats)``: a scalar tensor and detached floats: ``ratio/mean``, ``clip_ratio/low``,
        ``clip_ratio/high``, ``clip_ratio/region`` (clipped loss types), ``cispo_clip_ratio``,
        ``vespo/phi_seq_mean``, and ``kl`` when ``ref_logps`` is given.
    """
    if params is not None and settings:
        raise TypeError(f"pass either params or keyword settings, not both: {sorted(settings)}")
    p = params if params is not None else LossParams(**settings)
    logps, old_logps, ref_logps, advantages, mask, token_mask, sampling_weights = LossInputs(
        *inputs
    )
    _check_policy_args(logps, old_logps, ref_logps, advantages, mask, token_mask)
    if p.beta > 0.0 and ref_logps is None:
        raise ValueError(
            f"beta={p.beta} > 0 needs ref_logps (log-probs under the reference model); "
            "pass ref_logps or set beta=0."
        )

    valid = mask != 0  # (N, T) bool
    weight = valid.to(logps.dtype)  # (N, T)
    logps = _zero_padding(logps, valid)  # (N, T)
    old = logps.detach() if old_logps is None else _zero_padding(old_logps, valid, logps.dtype)
    log_ratio = logps - old  # (N, T)
    ratio = _importance_ratio(log_ratio, weight, p.importance_sampling_level)  # (N, T)
    adv = advantages.to(logps.dtype).unsqueeze(-1)  # (N, 1)

    definition = LOSS_TYPES[p.loss_type]
    terms = SurrogateTerms(ratio, log_ratio, logps, adv, weight)
    per_token, extra_stats = definition.surrogate(terms, p)  # (N, T)
    if p.off_policy_mask_threshold is not None:
        per_token = per_token * off_policy_mask(
            adv, logps, old, weight, p.off_policy_mask_threshold
        )
    if token_mask is not None:
        per_token = per_token * token_mask.to(logps.dtype)
    if sampling_weights is not None:
        per_token = per_token * sampling_weights.detach().to(logps.dtype)
    kl = None
    if ref_logps is not None:
        kl = kl_k3(logps, _zero_padding(ref_logps, valid, logps.dtype))  # (N, T), 0 on padding
        if p.use_bias_correction_kl:
            kl = kl * ratio  # DeepSeek-V3.2: unbiased reverse-KL gradient
        if p.beta != 0:
            per_token = per_token + p.beta * kl

    max_len = logps.shape[1] if p.max_completion_length is None else p.max_completion_length
    loss = definition.reduce(per_token * weight, weight, max_len)
    stats = _loss_stats(p, ratio, adv, weight, kl)
    stats.update(extra_stats)
    return loss, stats


def _zero_padding(
    x: torch.Tensor, valid: torch.Tensor, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Zero the padding positions so -inf/NaN there cannot reach the loss or the gradient."""
    x = x if dtype is None else x.to(dtype)
    return torch.where(valid, x, torch.zeros_like(x))


def _importance_ratio(log_ratio: torch.Tensor, weight: torch.Tensor, level: str) -> torch.Tensor:
    """rho per token (PPO eq. 6) or GSPO's length-normalized sequence ratio broadcast to (N, T)."""
    if level == "sequence":
        lengths = weight.sum(dim=-1, keepdim=True).clamp(min=1)  # (N, 1)
        log_ratio = ((log_ratio * weight).sum(dim=-1, keepdim=True) / lengths).expand_as(weight)
    return torch.exp(log_ratio)  # (N, T)


def _seq_extreme(x: torch.Tensor, weight: torch.Tensor, pick) -> float:
    """`pick` (min or max) over the sequences with a valid token of each one's masked mean of x."""
    x = x.to(weight.dtype).expand_as(weight)  # (N, 1) at sequence level
    counts = weight.sum(dim=-1)
    per_seq = (x * weight).sum(dim=-1)[counts > 0] / counts[counts > 0]
    return pick(per_seq.tolist()) if per_seq.numel() else 0.0


@torch.no_grad()
def _loss_stats(p: LossParams, ratio, adv, weight, kl) -> dict[str, float]:
    """Token-level clip fractions (clipped types), mean ratio and mean KL term over valid tokens."""
    stats = {"ratio/mean": masked_mean(ratio, weight)}
    if LOSS_TYPES[p.loss_type].clipped:
        low = masked_mean((ratio < 1.0 - p.epsilon_low) & (adv < 0), weight)
        high = masked_mean((ratio > 1.0 + p.eps_high) & (adv > 0), weight)
        stats.update({"clip_ratio/low": low, "clip_ratio/high": high})
        stats["clip_ratio/region"] = low + high
        # TRL's extremes over the sequences: the least low-clipped and the most high-clipped one
        stats["clip_ratio/low_min"] = _seq_extreme(
            (ratio < 1.0 - p.epsilon_low) & (adv < 0), weight, min
        )
        stats["clip_ratio/high_max"] = _seq_extreme(
            (ratio > 1.0 + p.eps_high) & (adv > 0), weight, max
        )
    if kl is not None:
        stats["kl"] = masked_mean(kl, weight)
    return stats


def _check_policy_args(logps, old_logps, ref_logps, advantages, mask, token_mask) -> None:
    named = {"logps": logps, "old_logps": old_logps, "ref_logps": ref_logps}
    named.update({"advantages": advantages, "mask": mask, "token_mask": token_mask})
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
    for name in ("old_logps", "ref_logps", "mask", "token_mask"):
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
    delta: float | None = None,
    off_policy_mask_threshold: float | None = None,
) -> None:
    """The one home of these checks: `LossParams` and `GRPOConfig` both call it.

    `GRPOConfig` names: `epsilon` (= epsilon_low), `epsilon_high`, `beta`, `max_completion_length`,
    `delta`, `off_policy_mask_threshold`.
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
    if delta is not None and not delta > 1.0:
        raise ValueError(
            f"delta={delta} caps the importance ratio from above, so it must be > 1 "
            "(INTELLECT-2 recommends > 1 + epsilon_high, e.g. 4); None disables it."
        )
    if off_policy_mask_threshold is not None and not off_policy_mask_threshold > 0.0:
        raise ValueError(
            f"off_policy_mask_threshold={off_policy_mask_threshold} must be > 0 (e.g. 0.5); "
            "None disables off-policy masking."
        )
