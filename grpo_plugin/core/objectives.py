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
- ``loss_types.py``: each ``loss_type`` as one registered ``LossType`` (its surrogate, reduction,
  parameters, what it needs from sampling); a new loss type is registered there.
- ``masks.py``: the high-entropy token mask and the off-policy sequence mask.
- ``entropy.py``: the entropy bonus and Skywork-OR1's adaptive coefficient.
"""

from __future__ import annotations

from . import loss_types
from .advantages import ESTIMATORS, decoupled_advantages, group_advantages
from .entropy import AdaptiveEntropyCoefficient, entropy_bonus
from .loss_types import LOSS_TYPES, LossType, register
from .losses import (
    IMPORTANCE_SAMPLING_LEVELS,
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
    "AdaptiveEntropyCoefficient",
    "LossInputs",
    "LossParams",
    "LossType",
    "check_loss_hyperparameters",
    "decoupled_advantages",
    "entropy_bonus",
    "group_advantages",
    "high_entropy_mask",
    "kl_k3",
    "objective_name",
    "off_policy_mask",
    "policy_loss",
    "register",
]

PAPERS = {
    "GRPO": "https://arxiv.org/abs/2402.03300",  # DeepSeekMath (Shao et al., 2024)
    "GSPO": "https://arxiv.org/abs/2507.18071",  # Zheng et al., 2025
    "RLOO": "https://arxiv.org/abs/2402.14740",  # Ahmadian et al., 2024
    # each loss type that names an objective: its paper (loss_types.py)
    **{d.objective: d.paper for d in LOSS_TYPES.values() if d.objective and d.paper},
}


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        choices = ", ".join(repr(a) for a in allowed)
        raise ValueError(f"{name} must be one of {choices}; got {value!r}.")


def objective_name(loss_type: str, importance_sampling_level: str, estimator: str) -> str:
    """Name of the objective a configuration amounts to, for logs and model cards.

    Precedence: the ``"rloo"`` estimator gives ``"RLOO"``; a loss type that names its objective
    whatever the ratio (``cispo``/``sapo``/``luspo``/``vespo``) its own name; a sequence-level
    ratio ``"GSPO"``; a loss type's token-level name (``dapo``: ``"DAPO"``, ``dr_grpo``:
    ``"Dr. GRPO"``); the estimator ``"dr_grpo"`` ``"Dr. GRPO"``; anything else (``bnpo``
    included) ``"GRPO"``. ``PAPERS[name]`` is the paper's arXiv link.
    """
    definition = loss_types.loss_type(loss_type)  # a registered one, or the choices
    _check_choice(
        "importance_sampling_level", importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS
    )
    _check_choice("estimator", estimator, ESTIMATORS)
    if estimator == "rloo":  # after the checks: an unknown loss type is refused here too
        return "RLOO"
    if definition.names_its_objective:
        return definition.objective
    if importance_sampling_level == "sequence":
        return "GSPO"
    if definition.objective is not None:
        return definition.objective
    if estimator == "dr_grpo":
        return "Dr. GRPO"
    return "GRPO"
