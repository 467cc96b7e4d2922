"""The policy engine: every forward of the policy in one home.

It owns the training forward (`forward.py`: log-probs, entropy, the MoE loss; the LM-head
scoring in `lm_head.py`), the decode step (`decode.py`; the prefill is the same forward at full
width), the rollout copy (`rollout_copy.py`, `kernels.py`) and the process's memory settings
(`memory.py`). `rollout/`, `training/` and evaluation call it; which fast path runs is decided
here, never by them.

Each fast path is a named lever (`levers.py`: what it needs, its admission check and tolerance);
`plan.py` picks the levers for the device; `fast_paths=False` (GRPOConfig) or
`GRPO_PLUGIN_FAST_PATHS=0` runs every forward through the reference path, plain transformers +
peft through their public APIs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from .forward import CompletionLogprobs, CompletionTokens, ForwardOptions, completion_logprobs
from .fused_lora import fuse_lora_linears
from .levers import LEVERS, Levers, default_levers
from .plan import levers_for
from .prompt_grad import SharedPromptGrad

__all__ = [
    "LEVERS",
    "CompletionLogprobs",
    "CompletionTokens",
    "ForwardOptions",
    "Levers",
    "PolicyEngine",
    "completion_logprobs",
    "default_levers",
]


@dataclass(frozen=True)
class PolicyEngine:
    """One policy's engine, built once from the config and the device: its levers."""

    levers: Levers

    @classmethod
    def build(cls, device: torch.device | str, fast_paths: bool = True) -> PolicyEngine:
        """The engine of a policy on `device` (`fast_paths=False`: the reference plan)."""
        return cls(levers_for(device, fast_paths))

    def prepare_policy(self, model: torch.nn.Module) -> int:
        """Give the policy's LoRA layers the fused forward where that lever is on and admitted;
        returns how many layers took it."""
        return fuse_lora_linears(model) if self.levers.fused_lora else 0

    def options(self, **fields: Any) -> ForwardOptions:
        """`ForwardOptions` with this engine's levers."""
        return ForwardOptions(levers=self.levers, **fields)

    def logprobs(
        self,
        model: torch.nn.Module,
        tokens: CompletionTokens | tuple,
        options: ForwardOptions,
        shared_prompt: SharedPromptGrad | None = None,
    ) -> CompletionLogprobs:
        """`completion_logprobs` of `model` with `options` under this engine's levers."""
        options = replace(options, levers=self.levers)
        return completion_logprobs(model, tokens, options, shared_prompt=shared_prompt)
