"""The engine's documented types: what a forward is given and what it returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from .levers import Levers, default_levers

__all__ = ["CompletionLogprobs", "CompletionTokens", "ForwardOptions"]


class CompletionTokens(NamedTuple):
    """A batch to score: prompts left-padded, completions right-padded."""

    prompt_ids: torch.LongTensor  # (N, Lp)
    prompt_mask: torch.LongTensor  # (N, Lp) 1 on real prompt tokens
    completion_ids: torch.LongTensor  # (N, Tc)
    completion_mask: torch.LongTensor  # (N, Tc) 1 on real completion tokens
    # (N, Tc) the tokens to score, a subset of completion_mask (a multi-turn completion attends
    # to its tool results but only its sampled tokens are scored); None: all of them
    score_mask: torch.LongTensor | None = None


@dataclass(frozen=True)
class ForwardOptions:
    """How `completion_logprobs` runs, and what it returns besides the log-probs."""

    temperature: float = 1.0  # logits / temperature, as sampled (<= 0: greedy, scored at 1)
    chunk_size: int = 1024  # completion positions per LM-head chunk (bounds the logits memory)
    group_size: int | None = None  # rows per shared prompt, for share_prompt_prefix
    share_prompt_prefix: bool = False  # rows p*G .. p*G+G-1 share prompt p: encode it once
    padding_free: bool = False  # with the shared prompt: completions packed into one row
    pad_to_multiple_of: int | None = None  # round trimmed widths up (fixed shapes); not packed
    return_entropy: bool = False  # also the (N, Tc) entropies
    entropy_grad: bool = False  # ... with their gradient (else detached)
    return_aux_loss: bool = False  # also the MoE router load-balancing loss (plain forward)
    bf16_products: bool = False  # the frozen base products in bf16 (train_precision 'bf16')
    levers: Levers = field(default_factory=default_levers)  # the fast paths it may take


class CompletionLogprobs(NamedTuple):
    """What `completion_logprobs` returns, always these three (a NamedTuple, so DDP's output
    walk still finds the tensors); `None` marks what was not asked for."""

    logps: torch.Tensor  # (N, Tc) float32, 0 off the scored tokens
    entropy: torch.Tensor | None = None  # (N, Tc) when return_entropy, 0 off the scored tokens
    aux_loss: torch.Tensor | None = None  # () the MoE router loss, when return_aux_loss
