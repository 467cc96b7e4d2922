"""The `vllm_*` fields and `use_vllm` (TRL's names and meanings), checked before any model loads.

What runs with `use_vllm=True` here: `vllm_mode='colocate'`, one process, tensor parallel size 1,
single-turn rollouts of our sampler's settings, scored after they are sampled (tools, environments and `rollout_func` are
refused by the trainer, `training/sampling/rollouts.py`). Each refusal is one line naming the
field and what works instead.
"""

from __future__ import annotations

from typing import Any

from .._compat.vllm_runtime import vllm_problem

VLLM_MODES = ("colocate", "server")
VLLM_MODEL_IMPLS = ("vllm", "transformers", "auto")


def check_vllm(config: Any) -> None:
    """Every `vllm_*` field's value; with `use_vllm`, what cannot run with it."""
    if config.vllm_mode not in VLLM_MODES:
        raise ValueError(f"vllm_mode={config.vllm_mode!r}: use 'colocate'.")
    if config.vllm_model_impl not in VLLM_MODEL_IMPLS:
        raise ValueError(
            f"vllm_model_impl={config.vllm_model_impl!r}: use one of {', '.join(VLLM_MODEL_IMPLS)}."
        )
    if not 0.0 < config.vllm_gpu_memory_utilization <= 1.0:
        raise ValueError(
            f"vllm_gpu_memory_utilization={config.vllm_gpu_memory_utilization} must be in (0, 1]."
        )
    longest, needed = config.vllm_max_model_length, config.max_completion_length + 1
    if config.max_prompt_length is not None:
        needed = config.max_prompt_length + config.max_completion_length
    if longest is not None and longest < needed:
        raise ValueError(
            f"vllm_max_model_length={longest} cannot hold a row of {needed} tokens (max_prompt_length "
            f"+ max_completion_length); raise it, or leave it None to size it from those."
        )
    drift = config.vllm_max_logp_drift
    if drift is not None and not 0.0 < drift < float("inf"):
        raise ValueError(
            f"vllm_max_logp_drift={drift} must be a positive number of nats (None: not checked)."
        )
    if config.use_vllm:
        _check_use_vllm(config)


def _check_use_vllm(config: Any) -> None:
    if config.vllm_mode == "server":
        raise ValueError(
            "vllm_mode='server' is not supported (no `trl vllm-serve` client here); use "
            "vllm_mode='colocate', the engine in the training process."
        )
    if config.vllm_tensor_parallel_size != 1:
        raise ValueError(
            f"vllm_tensor_parallel_size={config.vllm_tensor_parallel_size} is not supported: one "
            "engine per process; leave it 1."
        )
    if config.vllm_structured_outputs_regex is not None:
        raise ValueError(
            "vllm_structured_outputs_regex is not supported with use_vllm; leave it None."
        )
    if config.world_size > 1:
        raise ValueError(
            f"use_vllm with {config.world_size} processes is not supported: run one process "
            "(one GPU), or leave use_vllm False (our sampler runs on any number)."
        )
    if config.vllm_enable_sleep_mode and not _on_gpu(config):
        raise ValueError(
            "vllm_enable_sleep_mode=True needs a GPU (vLLM sleeps only CUDA memory); leave it False."
        )
    if config.compile_decode or config.cache_implementation == "static":
        raise ValueError(
            "compile_decode and cache_implementation='static' set our own decode loop, which "
            "use_vllm replaces; leave them unset."
        )
    if config.overlap_scoring:
        raise ValueError(
            "overlap_scoring with use_vllm is not supported: vLLM returns a rollout's completions "
            "at once, so there is no decoding to score beside; set overlap_scoring=False."
        )
    if config.sampling_params().suppress_tokens:
        raise ValueError("suppress_tokens with use_vllm is not supported; leave it unset.")
    problem = vllm_problem()
    if problem is not None:
        raise ValueError(f"use_vllm=True: {problem}.")


def _on_gpu(config: Any) -> bool:
    import torch

    return torch.cuda.is_available() and not config.use_cpu


def vllm_max_model_len(config: Any, model_context: int | None) -> int:
    """The longest row the engine holds: `vllm_max_model_length`, else the prompt budget plus
    the completion budget (the model's context when prompts are not cut)."""
    if config.vllm_max_model_length is not None:
        return config.vllm_max_model_length
    if config.max_prompt_length is not None:
        return config.max_prompt_length + config.max_completion_length
    return model_context or 4096
