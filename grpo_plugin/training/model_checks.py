"""What is checked of the policy's setup before it loads: the LoRA config, and a rollout copy
(`rollout_precision`) against what the load will make (a 4-bit base, bfloat16 weights, a LoRA
variant, the device). Each raises ValueError with one line naming the field and the fix; the
trainer and the recipe checks (so `--dry-run`) both run them.

Before these, `--lora.r 0` failed inside peft once the model had loaded, and a copy the policy
cannot have failed in `check_copyable` once it had loaded (`sampling/rollout_copy.py`, which
still checks the loaded model: a model passed in already loaded is only known there).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .._compat import lora_variant_fields

_NO_COPY = "use rollout_precision='policy'"


def check_lora(peft_config: Any) -> None:
    """The numbers peft checks only when it builds the adapter (after the model loaded), and a
    `lora_alpha` of 0, which makes every adapter's output 0: nothing would be learned."""
    if peft_config is None:
        return
    r = getattr(peft_config, "r", None)
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise ValueError(f"lora: r={r!r} must be a positive integer (the rank), e.g. r: 16.")
    alpha = getattr(peft_config, "lora_alpha", 8)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise ValueError(f"lora: lora_alpha={alpha!r} must be a finite number, e.g. 2 x r.")
    if alpha == 0:
        raise ValueError(
            "lora: lora_alpha=0 scales every adapter's output to 0, so nothing would be "
            "learned; use e.g. lora_alpha: 2 x r."
        )
    dropout = getattr(peft_config, "lora_dropout", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise ValueError(f"lora: lora_dropout={dropout!r} must be in [0, 1), e.g. 0.0.")


def _device_type(args: Any) -> str:
    """Where the policy will train, without building the Trainer's device state."""
    if getattr(args, "use_cpu", False):
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    return "mps" if mps is not None and mps.is_available() else "cpu"


def _quantized(init_kwargs: dict[str, Any]) -> bool:
    config = init_kwargs.get("quantization_config")
    if isinstance(config, dict):
        return bool(config.get("load_in_4bit") or config.get("load_in_8bit"))
    return config is not None


def check_copy_setup(args: Any, peft_config: Any, init_kwargs: dict[str, Any]) -> None:
    """`rollout_precision` 'bf16' or 'fp16' against the load to come (`init_kwargs` as
    `policy.model_init_kwargs` made them): what `check_copyable` refuses on the loaded model."""
    precision = args.rollout_precision
    if precision in ("policy", "auto"):
        return  # 'auto' picks 'policy' itself where a copy cannot be made
    if _quantized(init_kwargs):
        raise ValueError(
            f"rollout_precision={precision!r} with a quantized base (load_in_4bit or a "
            f"quantization_config): it already decodes from 4-bit weights; {_NO_COPY}."
        )
    variants = lora_variant_fields(peft_config)
    if variants:
        raise ValueError(
            f"rollout_precision={precision!r} with a LoRA variant ({', '.join(variants)}): the "
            f"copy's refresh adds B A to W, which the variant's rescaling does not follow; "
            f"{_NO_COPY} (or a plain LoRA)."
        )
    if precision == "bf16" and init_kwargs.get("dtype") == torch.bfloat16:
        raise ValueError(
            "rollout_precision='bf16' with the policy loaded in bfloat16 (model_init_kwargs "
            f"dtype): the copy would be the policy; {_NO_COPY}."
        )
    device = _device_type(args)
    if precision == "fp16" and device != "cpu":
        raise ValueError(
            f"rollout_precision='fp16' with the policy on {device}: fbgemm's fp16 layers run on "
            "a CPU only; use rollout_precision='bf16' (or 'auto')."
        )
