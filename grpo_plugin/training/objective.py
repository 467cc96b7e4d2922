"""The arithmetic of `GRPOTrainer.compute_loss` after the forward: everything TRL's `_compute_loss`
adds around the policy loss, as one object built from the config.

    policy term   core.losses.policy_loss (loss type, clip, delta, off-policy mask, KL)
                  x the high-entropy token mask (top_entropy_quantile < 1)
                  rescaled to the rollout's token count for a token mean over the rollout
                  ("dapo", "cispo", "vespo": their `LossType.token_mean`, core/loss_types.py)
  - c * H         the entropy bonus over the same tokens (entropy_coef, adaptive control)
  + coef * aux    the MoE router load-balancing loss (router_aux_loss_coef)

The Trainer divides the whole loss by the gradient-accumulation steps, as TRL does each term.

On several processes (`distributed.py`) every token-normalised quantity uses the global count, so
that averaging the gradients over processes gives the one-process loss: the rollout's tokens for
"dapo", "cispo" and "vespo" (the trainer passes them), and this micro-batch's tokens on every
process for "bnpo" and the entropy bonus. The entropy quantile is taken over every process's
tokens and the adaptive coefficient moves on the global mean entropy, as in TRL.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from .. import distributed
from ..core.batching import group_permutation
from ..core.objectives import (
    LOSS_TYPES,
    AdaptiveEntropyCoefficient,
    LossInputs,
    entropy_bonus,
    high_entropy_mask,
    policy_loss,
)
from ..core.sampling_correction import CorrectionParams, sampling_weights
from ..rollout.types import Rollout, TrainingBatch
from ..run import rundir
from ..scoring.rollout_advantages import rollout_advantages


def training_batch(rollout: Rollout, args: Any, reward_weights, tokenizer) -> TrainingBatch:
    """The rollout as the loss reads it: advantages `(N,)`, the loss mask `(N, Tc)` (sampled
    tokens; truncated rows out with `mask_truncated_completions`), padded as configured."""
    b = rollout.batch
    advantages = rollout_advantages(rollout, args, reward_weights)  # (N,)
    return TrainingBatch(
        prompt_ids=b.prompt_ids,
        prompt_mask=b.prompt_mask,
        completion_ids=b.completion_ids,
        completion_mask=b.completion_mask,
        loss_mask=b.loss_mask(args.mask_truncated_completions),  # (N, Tc)
        advantages=advantages.float(),
        sampled_mask=b.sampled_mask,
        sampling_logps=b.sampling_logps,  # a rollout copy's log-probs, for the correction
    ).padded_to_multiple(args.pad_to_multiple_of, tokenizer.pad_token_id)


def shuffle_for_reuse(batch: TrainingBatch, args: Any, generator: torch.Generator) -> TrainingBatch:
    """A group-preserving shuffle of a rollout that is trained in several micro-steps."""
    G = args.num_generations
    reused = args.num_iterations > 1 or args.steps_per_generation > 1
    if not reused or args.per_device_train_batch_size % G:
        return batch
    order = group_permutation(len(batch), G, generator)
    return batch.select(order.to(batch.advantages.device))


class TrainingObjective:
    """The loss of one micro-batch and its metrics (TRL's names)."""

    def __init__(self, args: Any, aux_loss_coef: float = 0.0, accelerator: Any = None):
        self.accelerator = accelerator  # None: one process
        self.params = args.loss_params()
        self.correction = args.correction_params() if args.sampling_correction else None
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
    def for_model(cls, args: Any, model: Any, accelerator: Any = None) -> TrainingObjective:
        """The objective for `model`: its MoE router loss weight comes from the model's config
        unless `router_aux_loss_coef` is set."""
        from ..models.policy import router_aux_loss_coefficient

        coef = router_aux_loss_coefficient(model, args.router_aux_loss_coef)
        return cls(args, coef, accelerator)

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
        tokens_per_slice: float | None,
        aux_loss: torch.Tensor | None = None,
        training: bool = True,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """`(loss, metrics)` for `(n, Tc)` log-probs and entropies of the micro-batch `batch`.
        `tokens_per_slice`: the rollout's loss tokens per micro-slice, the denominator of the
        token-level loss types (None: this micro-batch's own tokens); `training`: the adaptive
        entropy coefficient observes the batch."""
        mask = batch.loss_mask  # (n, Tc)
        token_mask = None
        if self.top_entropy_quantile < 1.0:
            token_mask = self._entropy_mask(entropy.detach(), mask)
        old, ref = batch.old_logps, batch.ref_logps
        weights, sampling_stats = self._sampling_weights(logps, batch)
        adv, params = batch.advantages, self.params
        loss, stats = policy_loss(
            LossInputs(logps, old, ref, adv, mask, token_mask=token_mask, sampling_weights=weights),
            params,
        )
        rollout_mean = tokens_per_slice is not None
        token_mean = LOSS_TYPES[params.loss_type].token_mean
        if token_mean == "rollout" and rollout_mean:  # over the rollout's tokens
            loss = loss * max(float(mask.sum()), 1.0) / max(tokens_per_slice, 1.0)
        elif token_mean == "micro_batch":  # per-token mean over the micro-batch
            loss = loss * self._global_share(mask)
        metrics = _loss_metrics(stats) | sampling_stats
        valid = batch.model_mask.bool()  # every sampled token, as TRL's `entropy` (no tool results)
        if valid.any():
            metrics["entropy"] = entropy[valid].mean().item()
        if self.entropy.enabled:
            loss = self._add_entropy_bonus(loss, entropy, mask, token_mask, metrics, training)
        if aux_loss is not None and self.needs_aux_loss:
            loss = loss + self.aux_loss_coef * aux_loss
            metrics["aux_loss"] = float(aux_loss.detach())
        return loss, metrics

    def evaluation_loss(
        self, logps: torch.Tensor, entropy: torch.Tensor, batch: TrainingBatch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """`(loss, metrics)` of an evaluation chunk, through this objective (its loss type and
        options, masks, entropy bonus at the current coefficient), so that evaluation and
        training compute one loss. Nothing moves (the adaptive coefficient observes training
        only) and nothing is gathered: processes evaluate different numbers of chunks, so every
        token mean is over this chunk's own tokens."""
        alone = copy.copy(self)  # the same params and entropy controller, without collectives
        alone.accelerator = None
        return alone(logps, entropy, batch, tokens_per_slice=None, training=False)

    def _sampling_weights(self, logps: torch.Tensor, batch: TrainingBatch):
        """`(weights or None, metrics)`: the correction for a rollout a cheaper copy sampled.
        pi_old is the policy when the rollout was made: `old_logps` when it is reused after an
        update, else these log-probs themselves (the policy has not moved since), detached."""
        if batch.sampling_logps is None:
            return None, {}
        old = batch.old_logps if batch.old_logps is not None else logps.detach()
        params = self.correction or CorrectionParams()  # off: still measure the mismatch
        weights, stats = sampling_weights(old, batch.sampling_logps, batch.loss_mask, params)
        return (weights if self.correction is not None else None), stats

    def _entropy_mask(self, entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """`(n, Tc)` bool: the top quantile by entropy, the threshold over every process's tokens."""
        valid = entropy[mask.bool()]  # (M,)
        pooled = distributed.gather_objects(self.accelerator, valid.float().cpu())
        pool = torch.cat(pooled).to(entropy.device)  # (M_all,)
        return high_entropy_mask(entropy, mask, self.top_entropy_quantile, pool=pool)

    def _global_share(self, mask: torch.Tensor) -> float:
        """This process's token count over the mean count of this micro-batch on every process:
        the factor that turns a local token mean into its share of the global one."""
        local = float(mask.sum())
        mean = distributed.mean_over_processes(self.accelerator, local)
        return local / mean if mean > 0 else 0.0

    def _add_entropy_bonus(self, loss, entropy, mask, token_mask, metrics, training):
        acting = mask if token_mask is None else mask * token_mask  # the policy term's tokens
        bonus = entropy_bonus(entropy, acting) * self._global_share(acting)
        metrics["policy_loss"] = float(loss.detach())
        if training:
            self.entropy.observe(float((entropy.detach() * acting).sum()), float(acting.sum()))
        return loss - self.entropy.applied() * bonus

    def save_state(self, checkpoint: str | Path) -> None:
        """Write the adaptive entropy controller's state into a checkpoint folder (TRL's file)."""
        if self.entropy.adaptive:
            state = {
                "entropy_coef": self.entropy.coef,
                "last_world_entropy": self.entropy.last_entropy,
            }
            rundir.write_json(Path(checkpoint) / rundir.ENTROPY_STATE_FILE, state)

    def load_state(self, checkpoint: str | Path | None) -> None:
        """Restore what `save_state` wrote (a resumed run continues with the same coefficient)."""
        state = (
            rundir.read_json(Path(checkpoint) / rundir.ENTROPY_STATE_FILE) if checkpoint else None
        )
        if self.entropy.adaptive and state:
            self.entropy.coef = float(state["entropy_coef"])
            self.entropy.last_entropy = float(state["last_world_entropy"])

    def end_optimizer_step(self) -> dict[str, float]:
        """Close an optimizer step (adaptive entropy update); the metrics to log for it."""
        if not self.entropy.enabled:
            return {}
        if self.entropy.adaptive:  # the step's entropy over every process's tokens
            total, tokens = self.entropy.window()
            mean = distributed.mean_over_processes
            self.entropy.end_step((mean(self.accelerator, total), mean(self.accelerator, tokens)))
        return {"entropy_coef": self.entropy.coef}


def _loss_metrics(stats: dict[str, float]) -> dict[str, float]:
    """TRL's metric names for the loss statistics (`clip_ratio/low` -> `clip_ratio/low_mean`)."""
    out = {}
    for key, value in stats.items():
        if key.startswith("clip_ratio/") and not key.endswith(("_min", "_max")):
            out[f"{key}_mean"] = value
        elif key != "ratio/mean":
            out[key] = value
    return out
