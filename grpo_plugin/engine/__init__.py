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

import logging
from dataclasses import dataclass, replace
from typing import Any

import torch

from .._compat import cpu_has_bf16_units
from .bf16_products import admit_layers
from .decode import DecodeSettings
from .forward import CompletionLogprobs, CompletionTokens, ForwardOptions, completion_logprobs
from .fused_lora import fuse_lora_linears, fused_layers
from .levers import LEVERS, Levers, default_levers, fast_paths_from_env
from .plan import DecodeAsk, decode_settings, levers_for
from .prompt_grad import SharedPromptGrad
from .rollout_copy import RolloutCopy
from .vllm_engine import VllmEngine, VllmSettings, serving_dtype

logger = logging.getLogger(__name__)

__all__ = [
    "LEVERS",
    "CompletionLogprobs",
    "CopyAsk",
    "DecodeAsk",
    "DecodeSettings",
    "CompletionTokens",
    "ForwardOptions",
    "Levers",
    "PolicyEngine",
    "TrainAsk",
    "VllmAsk",
    "VllmEngine",
    "completion_logprobs",
    "default_levers",
]


@dataclass(frozen=True)
class CopyAsk:
    """What a run asks of the rollout copy (GRPOConfig's fields, the loss type's definition)."""

    requested: str | None  # rollout_precision
    single_turn: bool
    sampling_correction: bool
    loss_takes_correction: bool  # the loss type's definition does not refuse the correction


@dataclass(frozen=True)
class TrainAsk:
    """What a run asks of the training forward's products (GRPOConfig's fields)."""

    requested: str | None  # train_precision: 'fp32', 'bf16' or None (the engine decides)
    autocast: bool  # bf16=True or fp16=True: autocast decides the products' dtype instead
    gradient_checkpointing: bool  # its recompute runs outside the training forward's context


@dataclass(frozen=True)
class VllmAsk:
    """What a run asks of the vLLM engine (GRPOConfig's `vllm_*` fields and lengths)."""

    requested_precision: str | None  # rollout_precision: the dtype vLLM serves in
    max_model_len: int
    max_num_seqs: int
    seed: int
    row_tokens: int  # a typical row: the prompt (max_prompt_length, else 512) + the completion
    gpu_memory_utilization: float
    enable_sleep_mode: bool
    model_impl: str


@dataclass(frozen=True)
class PolicyEngine:
    """One policy's engine, built once from the config and the device: its levers."""

    levers: Levers
    device: str = "cpu"  # the device type it plans for
    fast_paths: bool = True  # False: the reference plan (fast_paths=False or the environment)

    @classmethod
    def build(cls, device: torch.device | str, fast_paths: bool = True) -> PolicyEngine:
        """The engine of a policy on `device` (`fast_paths=False`: the reference plan)."""
        fast = fast_paths and fast_paths_from_env()
        return cls(levers_for(device, fast), torch.device(device).type, fast)

    def decode_settings(self, ask: DecodeAsk) -> DecodeSettings:
        """How the rollouts decode: what the run asks, where the levers allow it (plan.py)."""
        return decode_settings(self.levers, ask, self.device)

    def rollout_precision(self, ask: CopyAsk) -> str | None:
        """`rollout_precision` with None (the default) narrowed to where the bf16 copy's learning
        was measured: single-turn rollouts, `sampling_correction` on, a loss that takes the
        correction, fast paths on (the reference plan samples from the policy). Outside it,
        'policy'; inside, None, and the device decides on the first rollout
        (`rollout_copy.resolve_precision`). The number of processes is not a condition: every
        process samples from its own copy, refreshed after each optimizer step from the weights
        that are the same on all of them, so one process and several train alike."""
        if ask.requested is not None:
            return ask.requested
        measured = ask.single_turn and ask.sampling_correction and ask.loss_takes_correction
        return None if measured and self.fast_paths else "policy"

    def rollout_copy(self, precision: str, settings: DecodeSettings) -> RolloutCopy:
        """The copy the rollouts sample from, its bf16 layers packed where that lever is on (not
        under compile_decode, which traces plain layers)."""
        return RolloutCopy(precision, pack=self.levers.packed_bf16 and not settings.compile)

    def vllm_engine(self, ask: VllmAsk, policy: torch.nn.Module) -> VllmEngine:
        """The vLLM engine the rollouts sample from (`use_vllm=True`), in the dtype
        `serving_dtype` picks for this policy and device; built on its first refresh."""
        settings = VllmSettings(
            dtype=serving_dtype(ask.requested_precision, policy),
            max_model_len=ask.max_model_len,
            max_num_seqs=ask.max_num_seqs,
            seed=ask.seed,
            row_tokens=ask.row_tokens,
            gpu_memory_utilization=ask.gpu_memory_utilization,
            enable_sleep_mode=ask.enable_sleep_mode,
            model_impl=ask.model_impl,
            device=next(policy.parameters()).device.type,
        )
        return VllmEngine(settings)

    def prepare_policy(self, model: torch.nn.Module) -> int:
        """Give the policy's LoRA layers the fused forward where that lever is on and admitted;
        returns how many layers took it."""
        return fuse_lora_linears(model) if self.levers.fused_lora else 0

    def train_precision(self, ask: TrainAsk, model: torch.nn.Module) -> str:
        """'bf16' where the training forward takes its frozen base products in bf16 (lever
        `bf16_training`, bf16_products.py), else 'fp32'. Only when asked ('bf16'): None (the
        default) is 'fp32' on every device, because bf16 rounding turns the float summation-order
        differences between process layouts and micro-batch splits into differences of the
        gradient (docs/configuration.md, "bf16 products"). 'bf16' needs the lever on (a CPU
        plan, fast paths), a CPU with AVX512-BF16 or AMX, no autocast, no gradient
        checkpointing and fused LoRA layers over frozen float32 weights whose check passes; the
        config's checks (config/field_checks.py, models/setup_checks.py) refuse what they can see
        before the model loads, and what only the loaded model shows (no layer fused, a check
        refused) falls back to 'fp32' with a warning."""
        if ask.requested != "bf16" or ask.autocast or ask.gradient_checkpointing:
            return "fp32"
        where = self.levers.bf16_training and cpu_has_bf16_units()  # the lever: CPU plans only
        layers = admit_layers(model, fused_layers(model)) if where else 0
        if layers:
            logger.info(
                "train_precision: bf16 products with the frozen weights of %d LoRA layers "
                "(float32 master weights; train_precision='fp32' turns it off)",
                layers,
            )
            return "bf16"
        logger.warning(
            "train_precision='bf16': %s; training in float32",
            "no LoRA layer of this model can take bf16 products (none fused, or refused by the "
            "check)"
            if where
            else "not on this device (a CPU with AVX512-BF16 or AMX and fast paths on)",
        )
        return "fp32"

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
