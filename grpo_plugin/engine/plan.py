"""A plan per device: which levers a policy's engine takes where it runs.

- CPU: every lever (engine/levers.py), each behind its admission check. They were measured on
  CPUs (docs/benchmarks.md, "The engine's levers").
- CUDA and other accelerators: the training forward on transformers' own attention (SDPA or
  flash) and peft's own LoRA forward; none of the CPU levers was measured to pay on a GPU (the
  GPU check found our training forward slower than TRL's there: docs/gpu-check.md). The prompt is
  still encoded once per group (`shared_prompt`: transformers' own cache API, fewer tokens).
  The decode step is compiled and captured as a CUDA graph by default (`compile_decode`, see
  `decode_compiled`): one-token steps are bound by kernel launches there (same tokens, several times
  faster as a graph; docs/gpu-check.md).

`fast_paths=False` (or `GRPO_PLUGIN_FAST_PATHS=0`) gives the reference plan on any device.
"""

from __future__ import annotations

import torch

from .levers import Levers, default_levers, fast_paths_from_env

__all__ = ["decode_compiled", "levers_for"]

# what a GPU gives up: the levers measured only on CPUs, or CPU-only by nature
_CPU_ONLY = ("fused_lora", "frozen_head", "padding_free", "packed_bf16")


def levers_for(device: torch.device | str, fast_paths: bool = True) -> Levers:
    """The levers a policy on `device` may take."""
    levers = default_levers(fast_paths)
    if torch.device(device).type == "cpu":
        return levers
    return levers.only(**dict.fromkeys(_CPU_ONLY, False), cpu_memory_reuse=False)


def decode_compiled(asked: bool | None, device: torch.device | str, fast_paths: bool) -> bool:
    """Whether the rollouts' decode step is compiled: as `compile_decode` asks, and where it
    says None (the default), on CUDA with fast paths on."""
    if asked is not None:
        return asked
    return fast_paths and fast_paths_from_env() and torch.device(device).type == "cuda"
