"""The GRPO family of objectives: pure torch functions over tensors (no model, no trainer).

One import point for the pieces, each in its own module with the paper it implements:

- ``advantages.py``: ``group_advantages`` (DeepSeekMath 4.1.2, https://arxiv.org/abs/2402.03300;
  Dr. GRPO, https://arxiv.org/abs/2503.20783; RLOO, https://arxiv.org/abs/2402.14740) and
  ``decoupled_advantages`` (GDPO's normalize-then-sum, https://arxiv.org/abs/2601.05242).
- ``losses.py``: ``policy_loss`` (DeepSeekMath eq. 3 with PPO's ratio and clip,
  https://arxiv.org/abs/1707.06347; GSPO's sequence ratio, https://arxiv.org/abs/2507.18071; the
  length normalizations of DAPO, https://arxiv.org/abs/2503.14476, Dr. GRPO and LUSPO), ``kl_k3``
  (DeepSeekMath eq. 4) with DeepSeek-V3.2's ratio correction, ``LossParams``.
- ``surrogates.py``: the per-token losses: clipped (with INTELLECT-2's ``delta``), CISPO, SAPO,
  VESPO.
- ``masks.py``: the high-entropy token mask and the off-policy sequence mask.
- ``entropy.py``: the entropy bonus and Skywork-OR1's adaptive coefficient.
"""

from __future__ import annotations

from .advantages import ESTIMATORS, decoupled_advantages, group_advantages
from .entropy import AdaptiveEntropyCoefficient, entropy_bonus
from .losses import (
    IMPORTANCE_SAMPLING_LEVELS,
    LOSS_TYPES,
    TOKEN_LEVEL_LOSS_TYPES,
    LossInputs,
    LossParams,
    check_loss_hyperparameters,
    kl_k3,
    policy_loss,
)
from .masks import high_entropy_mask, off_policy_mask

__all__ = [
    "ESTIMATORS",
    "IMPORTANCE_SAMPLING_LEVELS",
    "LOSS_TYPES",
    "PAPERS",
    "TOKEN_LEVEL_LOSS_TYPES",
    "AdaptiveEntropyCoefficient",
    "LossInputs",
    "LossParams",
    "check_loss_hyperparameters",
    "decoupled_advantages",
    "entropy_bonus",
    "group_advantages",
    "high_entropy_mask",
    "kl_k3",
    "objective_name",
    "off_policy_mask",
    "policy_loss",
]

PAPERS = {
    "GRPO": "https://arxiv.org/abs/2402.03300",  # DeepSeekMath (Shao et al., 2024)
    "DAPO": "https://arxiv.org/abs/2503.14476",  # Yu et al., 2025
    "Dr. GRPO": "https://arxiv.org/abs/2503.20783",  # Liu et al., 2025
    "GSPO": "https://arxiv.org/abs/2507.18071",  # Zheng et al., 2025
    "RLOO": "https://arxiv.org/abs/2402.14740",  # Ahmadian et al., 2024
    "CISPO": "https://arxiv.org/abs/2506.13585",  # MiniMax-M1, 2025
    "SAPO": "https://arxiv.org/abs/2511.20347",  # Soft Adaptive Policy Optimization, 2025
    "LUSPO": "https://arxiv.org/abs/2602.05261",  # Length-Unbiased Sequence PO, 2026
    "VESPO": "https://arxiv.org/abs/2602.10693",  # Variational Sequence-level Soft PO, 2026
}
# Loss types that name their own objective (the card links its paper).
_NAMED_LOSS_TYPES = {"cispo": "CISPO", "sapo": "SAPO", "luspo": "LUSPO", "vespo": "VESPO"}


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        choices = ", ".join(repr(a) for a in allowed)
        raise ValueError(f"{name} must be one of {choices}; got {value!r}.")


def objective_name(loss_type: str, importance_sampling_level: str, estimator: str) -> str:
    """Name of the objective a configuration amounts to, for logs and model cards.

    Precedence: the ``"rloo"`` estimator gives ``"RLOO"``; ``cispo``/``sapo``/``luspo``/``vespo``
    their own name; a sequence-level ratio ``"GSPO"``; ``loss_type="dapo"`` ``"DAPO"``;
    ``loss_type`` or estimator ``"dr_grpo"`` ``"Dr. GRPO"``; anything else (``bnpo`` included)
    ``"GRPO"``. ``PAPERS[name]`` is the paper's arXiv link.
    """
    _check_choice("loss_type", loss_type, LOSS_TYPES)
    _check_choice(
        "importance_sampling_level", importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS
    )
    _check_choice("estimator", estimator, ESTIMATORS)
    if estimator == "rloo":
        return "RLOO"
    if loss_type in _NAMED_LOSS_TYPES:
        return _NAMED_LOSS_TYPES[loss_type]
    if importance_sampling_level == "sequence":
        return "GSPO"
    if loss_type == "dapo":
        return "DAPO"
    if "dr_grpo" in (loss_type, estimator):
        return "Dr. GRPO"
    return "GRPO"
