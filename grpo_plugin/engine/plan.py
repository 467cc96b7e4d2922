"""A plan per device: which levers a policy's engine takes where it runs.

- CPU: every lever (engine/levers.py), each behind its admission check. They were measured on
  CPUs (docs/benchmarks.md, "The engine's levers").
- CUDA and other accelerators: the training forward on transformers' own attention (SDPA or
  flash) and peft's own LoRA forward; none of the CPU levers was measured to pay on a GPU (the
  GPU check found our training forward slower than TRL's there: docs/gpu-check.md). The prompt is
  still encoded once per group (`shared_prompt`: transformers' own cache API, fewer tokens).
  The decode step is compiled and captured as a CUDA graph by default (`compile_decode`, see
  `decode_settings`): one-token steps are bound by kernel launches there (same tokens, several times
  faster as a graph; docs/gpu-check.md).

`fast_paths=False` (or `GRPO_PLUGIN_FAST_PATHS=0`) gives the reference plan on any device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .decode import DecodeSettings
from .levers import Levers, default_levers

__all__ = ["DecodeAsk", "decode_settings", "levers_for"]

# what a GPU gives up: the levers measured only on CPUs, or CPU-only by nature
_CPU_ONLY = ("fused_lora", "frozen_head", "padding_free", "packed_bf16", "bf16_training")


def levers_for(device: torch.device | str, fast_paths: bool = True) -> Levers:
    """The levers a policy on `device` may take."""
    levers = default_levers(fast_paths)
    if torch.device(device).type == "cpu":
        return levers
    return levers.only(**dict.fromkeys(_CPU_ONLY, False), cpu_memory_reuse=False)


@dataclass(frozen=True)
class DecodeAsk:
    """What a run asks of the rollouts' decode loop (GRPOConfig's fields)."""

    static_cache: bool = False  # cache_implementation='static'
    compile: bool | None = None  # compile_decode; None: the device's plan
    single_turn: bool = True  # no tools, environments or rollout_func


def decode_settings(levers: Levers, ask: DecodeAsk, device: torch.device | str) -> DecodeSettings:
    """The decode loop a run gets: what it asks, where the levers allow it. `compile_decode=None`
    compiles on CUDA for single-turn rollouts (one-token steps are bound by kernel launches
    there; docs/gpu-check.md). The reference plan (fast_paths=False) runs the dynamic loop with
    every row prefilled, whatever was asked."""
    compile = ask.compile
    if compile is None:
        compile = torch.device(device).type == "cuda" and ask.single_turn
    return DecodeSettings(
        static_cache=ask.static_cache and levers.static_decode,
        compile=compile and levers.compiled_decode,
        shared_prefill=levers.shared_prefill,
    )
