"""What is checked of the policy's setup before it loads: the LoRA config, and a rollout copy
(`rollout_precision`) against what the load will make (a 4-bit base, bfloat16 weights, a LoRA
variant, the device). Each raises ValueError with one line naming the field and the fix; the
trainer and the recipe checks (so `--dry-run`) both run them.

Before these, `--lora.r 0` failed inside peft once the model had loaded, and a copy the policy
cannot have failed in `check_copyable` once it had loaded (`engine/rollout_copy.py`, which
still checks the loaded model: a model passed in already loaded is only known there).
`check_against_model_config` needs the model's config (the recipe checks read it before the
weights; the trainer does not, and peft and transformers report those after the load).
"""

from __future__ import annotations

import difflib
import math
from typing import Any

import torch

from .._compat import (
    LORA_INIT_OPTIONS,
    lora_init_known,
    lora_variant_fields,
    moe_router_config_of,
)

_NO_COPY = "use rollout_precision='policy'"
_LORA_BIAS = ("none", "all", "lora_only")
# `from_pretrained` keywords about loading (files, devices, quantization, dtype), not the model:
# an empty model is built with the rest of `model_init_kwargs`
_LOAD_ONLY = frozenset(
    "adapter_kwargs adapter_name cache_dir device_map device_mesh dtype force_download gguf_file "
    "key_mapping kernel_config local_files_only low_cpu_mem_usage max_memory offload_buffers "
    "offload_folder offload_state_dict output_loading_info proxies quantization_config revision "
    "subfolder token torch_dtype tp_plan tp_size trust_remote_code use_kernels use_safetensors "
    "variant weights_only".split()
)


def check_lora_keys(lora: dict[str, Any]) -> None:
    """A `lora` mapping names only `peft.LoraConfig` arguments; an unknown one gets the closest
    (peft's own TypeError said only "unexpected keyword argument")."""
    import dataclasses

    from peft import LoraConfig

    known = sorted(f.name for f in dataclasses.fields(LoraConfig) if f.init)
    for key in lora:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"unknown lora key {key!r}{hint} (the keys are peft.LoraConfig's arguments, "
                "e.g. r, lora_alpha, lora_dropout, target_modules)"
            )


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
    bias = getattr(peft_config, "bias", "none")
    if bias not in _LORA_BIAS:
        raise ValueError(
            f"lora: bias={bias!r} is not supported; use one of {', '.join(_LORA_BIAS)}."
        )
    init = getattr(peft_config, "init_lora_weights", True)
    if not isinstance(init, bool) and not lora_init_known(init):
        raise ValueError(
            f"lora: init_lora_weights={init!r} is not one peft knows; use true (the default), "
            f"false or one of {', '.join(LORA_INIT_OPTIONS)}."
        )


def check_reference_setup(args: Any, peft_config: Any) -> None:
    """`sync_ref_model` moves a separate reference towards the policy; a LoRA policy's reference
    is its own base with the adapter off (refused once the model had loaded, before)."""
    if args.sync_ref_model and peft_config is not None:
        raise ValueError(
            "sync_ref_model=True needs a separate reference model, and a PEFT policy's "
            "reference is its base with the adapter off; train without a LoRA adapter or set "
            "sync_ref_model=False."
        )


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
    if precision in (None, "policy", "auto"):
        return  # None and 'auto' pick 'policy' themselves where a copy cannot be made
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


def check_train_precision_setup(args: Any, peft_config: Any, init_kwargs: dict[str, Any]) -> None:
    """`train_precision='bf16'` against the load to come: it needs a plain LoRA adapter (its
    products are the fused layers') over float32 base weights."""
    if getattr(args, "train_precision", None) != "bf16":
        return
    fix = "or set train_precision='fp32'"
    if peft_config is None:
        raise ValueError(
            "train_precision='bf16' without a LoRA adapter: its bf16 products are those of the "
            f"frozen base weights; add a `lora` section (a peft_config) {fix}."
        )
    if _quantized(init_kwargs):
        raise ValueError(
            "train_precision='bf16' with a quantized base (load_in_4bit or a "
            "quantization_config): the base products are 4-bit already; set train_precision='fp32'."
        )
    if init_kwargs.get("dtype") not in (None, "auto", torch.float32, "float32"):
        raise ValueError(
            f"train_precision='bf16' with model_init_kwargs dtype={init_kwargs.get('dtype')}: "
            f"it lowers float32 base weights; load them in float32 {fix}."
        )
    if lora_variant_fields(peft_config) or getattr(peft_config, "lora_dropout", 0):
        raise ValueError(
            "train_precision='bf16' with lora_dropout > 0 or a LoRA variant: peft's own forward "
            f"runs those layers, without bf16 products; use lora_dropout=0 and a plain LoRA {fix}."
        )


def check_against_model_config(
    args: Any, peft_config: Any, config: Any, init_kwargs: dict[str, Any]
) -> None:
    """What needs the model's config but not its weights (`grpo-plugin train` reads the config
    before loading): `router_aux_loss_coef` on a model without a router; `model_init_kwargs`
    the model refuses (an unknown `attn_implementation`, a keyword its class does not take);
    LoRA `target_modules` that match no module, or the LM head with `cast_lm_head_to_fp32`.
    The last two on an empty (meta-device) model built from the config."""
    kind = getattr(config, "model_type", "model")
    if args.router_aux_loss_coef and moe_router_config_of(config) is None:
        raise ValueError(
            f"router_aux_loss_coef={args.router_aux_loss_coef} is set but this {kind} model is "
            "not a Mixture-of-Experts model that returns router logits; leave it None."
        )
    extra = {k: v for k, v in init_kwargs.items() if k not in _LOAD_ONLY}
    targets = getattr(peft_config, "target_modules", None)
    # None: peft's defaults for the architecture; 'all-linear': every linear layer but the head
    named = not (targets is None or isinstance(targets, str) and targets.lower() == "all-linear")
    if not (extra or named):
        return
    remote = bool(init_kwargs.get("trust_remote_code"))
    model = _empty_model(config, remote, {})
    if model is None:
        return  # no empty model for this config: the load will tell
    if extra:
        try:
            _empty_model(config, remote, extra, strict=True)
        except Exception as err:  # noqa: BLE001 - it builds without them: they are the fault
            text = " ".join(str(err).split())[:300]
            raise ValueError(f"model_init_kwargs {sorted(extra)}: {text}") from None
    if named:
        _check_targets(args, peft_config, model, kind)


def _check_targets(args: Any, peft_config: Any, model: Any, kind: str) -> None:
    """LoRA `target_modules` match a module of `model`, and not its head when that is cast to
    float32 (peft and `cast_lm_head_to_fp32` refused them once the model had loaded)."""
    from peft.tuners.tuners_utils import check_target_module_exists

    head_module = model.get_output_embeddings()
    head = next((n for n, m in model.named_modules() if m is head_module), None)
    matched = {n for n, _ in model.named_modules() if check_target_module_exists(peft_config, n)}
    if not matched:
        targets = peft_config.target_modules
        shown = sorted(targets) if isinstance(targets, (set, list, tuple)) else targets
        raise ValueError(
            f"lora: target_modules={shown!r} match no module of this {kind} model; use "
            "'all-linear' or module names such as q_proj, v_proj."
        )
    if args.cast_lm_head_to_fp32 and head in matched:
        raise ValueError(
            "cast_lm_head_to_fp32=True is not supported with a LoRA adapter on lm_head: remove "
            f"{head!r} from the adapter's target_modules, or set cast_lm_head_to_fp32=False."
        )


def _empty_model(config: Any, remote: bool, kwargs: dict[str, Any], strict: bool = False):
    """A meta-device model of `config` (no memory, no weights), built with `kwargs` as
    `from_pretrained` would apply them (those naming a config attribute set it); None when it
    cannot be built, or the error itself when `strict`."""
    import copy

    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    config, kwargs = copy.deepcopy(config), dict(kwargs)
    for key in [k for k in kwargs if k != "attn_implementation" and hasattr(config, k)]:
        setattr(config, key, kwargs.pop(key))
    try:
        with init_empty_weights():
            return AutoModelForCausalLM.from_config(config, trust_remote_code=remote, **kwargs)
    except Exception:  # noqa: BLE001 - best effort: the real load reports its own error
        if strict:
            raise
        return None
