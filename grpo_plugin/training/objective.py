"""The arithmetic of `GRPOTrainer.compute_loss` after the forward: everything TRL's `_compute_loss`
adds around the policy loss, as one object built from the config.

    policy term   core.losses.policy_loss (loss type, clip, delta, off-policy mask, KL)
                  x the high-entropy token mask (top_entropy_quantile < 1)
                  rescaled to the rollout's token count for "dapo", "cispo", "vespo"
  - c * H         the entropy bonus over the same tokens (entropy_coef, adaptive control)
  + coef * aux    the MoE router load-balancing loss (router_aux_loss_coef)

The Trainer divides the whole loss by the gradient-accumulation steps, as TRL does each term.
"""

from __future__ import annotations

from typing import Any

import torch

from ..core.objectives import (
    TOKEN_LEVEL_LOSS_TYPES,
    AdaptiveEntropyCoefficient,
    entropy_bonus,
    high_entropy_mask,
    policy_loss,
)
from ..rollout.types import TrainingBatch


class TrainingObjective:
    """The loss of one micro-batch and its metrics (TRL's names)."""

    def __init__(self, args: Any, aux_loss_coef: float = 0.0):
        self.params = args.loss_params()
        self.top_entropy_quantile = args.top_entropy_quantile
        self.aux_loss_coef = aux_loss_coef
        self.entropy = AdaptiveEntropyCoefficient(
            coef=args.entropy_coef,
            adaptive=args.use_adaptive_entropy,
            target=args.entropy_target,
            delta=args.entropy_coef_delta,
            coef_min=args.entropy_coef_min,
            coef_max=args.entropy_coef_max,
        )

    @classmethod
    def for_model(cls, args: Any, model: Any) -> TrainingObjective:
        """The objective for `model`: its MoE router loss weight comes from the model's config
        unless `router_aux_loss_coef` is set."""
        from .policy import router_aux_loss_coefficient

        return cls(args, router_aux_loss_coefficient(model, args.router_aux_loss_coef))

    @property
    def needs_entropy_grad(self) -> bool:
        return self.entropy.enabled

    @property
    def needs_aux_loss(self) -> bool:
        return self.aux_loss_coef != 0.0

    def __call__(
        self,
        logps: torch.Tensor,
        entropy: torch.Tensor,
        batch: TrainingBatch,
        tokens_per_slice: float,
        aux_loss: torch.Tensor | None = None,
        training: bool = True,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """`(loss, metrics)` for `(n, Tc)` log-probs and entropies of the micro-batch `batch`."""
        mask = batch.loss_mask  # (n, Tc)
        token_mask = None
        if self.top_entropy_quantile < 1.0:
            token_mask = high_entropy_mask(entropy.detach(), mask, self.top_entropy_quantile)
        old, ref = batch.old_logps, batch.ref_logps
        loss, stats = policy_loss(
            logps, old, ref, batch.advantages, mask, self.params, token_mask=token_mask
        )
        if self.params.loss_type in TOKEN_LEVEL_LOSS_TYPES:  # per-token mean over the rollout
            loss = loss * max(float(mask.sum()), 1.0) / max(tokens_per_slice, 1.0)
        metrics = _loss_metrics(stats)
        if self.entropy.enabled:
            loss = self._add_entropy_bonus(loss, entropy, mask, token_mask, metrics, training)
        if aux_loss is not None and self.needs_aux_loss:
            loss = loss + self.aux_loss_coef * aux_loss
            metrics["aux_loss"] = float(aux_loss.detach())
        return loss, metrics

    def _add_entropy_bonus(self, loss, entropy, mask, token_mask, metrics, training):
        acting = mask if token_mask is None else mask * token_mask  # the policy term's tokens
        bonus = entropy_bonus(entropy, acting)
        metrics["policy_loss"] = float(loss.detach())
        if training:
            self.entropy.observe(float((entropy.detach() * acting).sum()), float(acting.sum()))
        return loss - self.entropy.applied() * bonus

    def end_optimizer_step(self) -> dict[str, float]:
        """Close an optimizer step (adaptive entropy update); the metrics to log for it."""
        if not self.entropy.enabled:
            return {}
        self.entropy.end_step()
        return {"entropy_coef": self.entropy.coef}


def _loss_metrics(stats: dict[str, float]) -> dict[str, float]:
    """TRL's metric names for the loss statistics (`clip_ratio/low` -> `clip_ratio/low_mean`)."""
    out = {}
    for key, value in stats.items():
        if key.startswith("clip_ratio/"):
            out[f"{key}_mean"] = value
        elif key != "ratio/mean":
            out[key] = value
    return out
