"""The entropy bonus and Skywork-OR1's adaptive entropy coefficient (TRL's ``entropy_coef`` family).

The objective becomes ``L = L_policy - c * H`` where ``H`` is the mean per-token entropy of the
policy over the tokens the policy loss acts on. ``H`` is a plain mean whatever ``loss_type`` is,
so ``c`` means the same for every loss type (as TRL).

Adaptive control (Skywork-OR1, https://arxiv.org/abs/2505.22312, section 3.2.5, as TRL): after
each optimizer step, ``c`` moves by ``delta`` towards keeping the measured entropy at the target
(up when the entropy is at or below it, down otherwise, clamped to ``[c_min, c_max]``), and the
bonus is applied only while the last measured entropy is at or below the target. The first step
applies no bonus (nothing measured yet).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["AdaptiveEntropyCoefficient", "entropy_bonus"]


def entropy_bonus(entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of the ``(N, T)`` per-token ``entropy`` over ``mask`` (a scalar; 0 for an empty mask).

    Differentiable when ``entropy`` is; subtract ``c *`` it from the loss.
    """
    weight = mask.to(entropy.dtype)
    return (entropy * weight).sum() / weight.sum().clamp(min=1.0)


@dataclass
class AdaptiveEntropyCoefficient:
    """The entropy coefficient ``c`` of one run, fixed or adaptive.

    Call ``applied()`` for the coefficient of the current optimizer step, ``observe`` once per
    micro-batch with its entropy sum and token count, and ``end_step()`` at each optimizer step.
    """

    coef: float = 0.0
    adaptive: bool = False
    target: float = 0.2
    delta: float = 0.005
    coef_min: float = 0.0
    coef_max: float = 1.0
    last_entropy: float = math.inf
    _entropy_sum: float = 0.0
    _tokens: float = 0.0

    @property
    def enabled(self) -> bool:
        """Whether the bonus term exists at all (adaptive control keeps it even at ``c = 0``)."""
        return self.adaptive or self.coef != 0.0

    def applied(self) -> float:
        """The coefficient every micro-batch of this optimizer step uses."""
        if self.adaptive and self.last_entropy > self.target:
            return 0.0
        return self.coef

    def observe(self, entropy_sum: float, tokens: float) -> None:
        """Accumulate one micro-batch (only adaptive control needs it)."""
        self._entropy_sum += float(entropy_sum)
        self._tokens += float(tokens)

    def window(self) -> tuple[float, float]:
        """The entropy sum and token count observed since the last ``end_step``."""
        return self._entropy_sum, self._tokens

    def end_step(self, totals: tuple[float, float] | None = None) -> float | None:
        """Close the optimizer step: update ``c`` from the step's mean entropy; returns that mean.

        ``totals``: ``(entropy sum, tokens)`` to use instead of ``window()`` (e.g. summed, or
        averaged, over processes: only their ratio counts).
        """
        if not self.adaptive:
            return None
        entropy_sum, tokens = self.window() if totals is None else totals
        entropy = entropy_sum / tokens if tokens > 0 else 0.0
        if entropy <= self.target:
            self.coef = min(self.coef + self.delta, self.coef_max)
        else:
            self.coef = max(self.coef - self.delta, self.coef_min)
        self.last_entropy = entropy
        self._entropy_sum = self._tokens = 0.0
        return entropy
