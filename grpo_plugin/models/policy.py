"""The one model-loading path: the trainer, `grpo-plugin eval` and the recipes all come through here.

A policy is full, LoRA, or 4-bit NF4 QLoRA. The reference for a PEFT policy is the same weights
with the adapter disabled: no second copy of the model. Only full fine-tuning with `beta > 0` pays
for a frozen deep copy. Tokenizers pad on the LEFT (generation needs prompts flush right) and
always have a pad token (eos when the checkpoint has none).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from .._compat import (
    moe_router_config,
    set_training_flags,
    training_flags,
    unwrap_peft,
)
from ..engine.lm_head import cast_lm_head_to_fp32
from .embedded import resolve_model_path
from .setup_checks import (
    check_copy_setup,
    check_lora,
    check_lora_keys,
    check_reference_setup,
    check_train_precision_setup,
)

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from peft import LoraConfig
    from transformers import PreTrainedTokenizerBase

# LoRA settings a recipe or `load_policy` gets unless it says otherwise.
LORA_DEFAULTS = {"target_modules": "all-linear", "task_type": "CAUSAL_LM"}


def is_peft_model(model: Any) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def is_quantized(model: Any) -> bool:
    return bool(
        getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)
    )


def default_dtype() -> torch.dtype:
    """fp32 on CPU; bf16 on CUDA when the GPU supports it, else fp32."""
    if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def lora_config(lora: dict[str, Any] | LoraConfig) -> LoraConfig:
    """A `peft.LoraConfig` from a dict of its arguments (defaults: all-linear, CAUSAL_LM)."""
    from peft import LoraConfig

    if isinstance(lora, LoraConfig):
        check_lora(lora)  # what peft checks only once the model has loaded
        return lora
    if not isinstance(lora, dict):
        raise TypeError(
            f"lora must be a dict of peft.LoraConfig arguments or a LoraConfig, "
            f"got {type(lora).__name__}"
        )
    check_lora_keys(lora)  # "did you mean", not peft's "unexpected keyword argument"
    try:
        config = LoraConfig(**{**LORA_DEFAULTS, **lora})
    except (TypeError, ValueError) as err:
        raise ValueError(f"lora: {' '.join(str(err).split())} (see peft.LoraConfig)") from err
    check_lora(config)
    return config


def nf4_quantization(compute_dtype: torch.dtype | str) -> dict[str, Any]:
    """QLoRA's 4-bit base: NF4 with double quantization (a `BitsAndBytesConfig` as a dict)."""
    if isinstance(compute_dtype, torch.dtype):
        compute_dtype = str(compute_dtype).removeprefix("torch.")
    return {
        "load_in_4bit": True,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": True,
        "bnb_4bit_compute_dtype": compute_dtype,
    }


def model_init_kwargs(
    kwargs: dict[str, Any] | None, *, bf16: bool = False, load_in_4bit: bool = False
) -> dict[str, Any]:
    """`from_pretrained` keyword arguments: dtype names become dtypes, a quantization dict a
    `BitsAndBytesConfig`; `load_in_4bit` adds NF4 unless a quantization config is given.

    Without a `dtype` the weights load in float32, `bf16` or not: `bf16=True` is mixed precision
    (float32 master weights, bf16 autocast in the forward), as in TRL. A quantized base is the
    exception: its unquantized parts and its compute dtype are bf16 under `bf16` (QLoRA)."""
    out = dict(kwargs or {})
    if isinstance(out.get("dtype"), str) and out["dtype"] != "auto":
        out["dtype"] = _torch_dtype(out["dtype"])
    quantized = load_in_4bit or out.get("quantization_config") is not None
    out.setdefault("dtype", torch.bfloat16 if bf16 and quantized else torch.float32)
    if load_in_4bit and "quantization_config" not in out:
        compute = out["dtype"] if isinstance(out["dtype"], torch.dtype) else torch.float32
        out["quantization_config"] = nf4_quantization(compute)
    if isinstance(out.get("quantization_config"), dict):
        from transformers import BitsAndBytesConfig

        try:
            out["quantization_config"] = BitsAndBytesConfig(**out["quantization_config"])
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"model_init_kwargs quantization_config: {' '.join(str(err).split())} (see "
                "transformers.BitsAndBytesConfig)"
            ) from err
    if out.get("quantization_config") is not None and torch.cuda.is_available():
        out.setdefault("device_map", {"": torch.cuda.current_device()})
    return out


def _torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(
            f"model_init_kwargs dtype={name!r} is not a torch dtype; use e.g. 'bfloat16', "
            "'float16', 'float32' or 'auto'."
        )
    return dtype


def trainer_init_kwargs(
    model: Any, args: Any, quantization_config: Any = None, peft_config: Any = None
) -> dict[str, Any]:
    """The trainer's `from_pretrained` kwargs for a policy (and reward models) given by name:
    `model_init_kwargs`, TRL's `quantization_config` argument and `trust_remote_code`. With
    them, before anything loads: the `peft_config` (`lora_config`) and, for a model given by
    name, a rollout copy against the load to come (`model_checks.check_copy_setup`; a loaded
    model's copy is checked by the sampler)."""
    if not isinstance(model, str) and (args.model_init_kwargs or quantization_config):
        raise ValueError(
            "model_init_kwargs and quantization_config only apply when `model` is a string, and "
            "with a model already instantiated they would be ignored: drop them (or load the "
            "model yourself with them)."
        )
    kwargs = dict(args.model_init_kwargs or {})
    if quantization_config is not None:
        if "quantization_config" in kwargs:
            raise ValueError(
                "quantization_config is set twice (argument and model_init_kwargs); keep one."
            )
        kwargs["quantization_config"] = quantization_config
    kwargs.setdefault("trust_remote_code", args.trust_remote_code)
    kwargs = model_init_kwargs(kwargs, bf16=args.bf16)
    peft = lora_config(peft_config) if peft_config is not None else None
    check_reference_setup(args, peft)
    if isinstance(model, str):
        check_copy_setup(args, peft, kwargs)
        check_train_precision_setup(args, peft, kwargs)
    return kwargs


def load_model(name: str, init_kwargs: dict[str, Any] | None = None) -> PreTrainedModel:
    """`AutoModelForCausalLM.from_pretrained` on a path, Hub id or `embedded:` name."""
    logger.info("Loading model %s ...", name)  # seconds to minutes (a first embedded conversion)
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(name), **(init_kwargs or {}))
    logger.info("Loaded %s in %.1f s", name, time.perf_counter() - start)
    return model


def load_adapter(model: PreTrainedModel, adapter_dir: str | Path) -> PreTrainedModel:
    """A saved LoRA adapter (a run's output dir or checkpoint) on top of `model`."""
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(adapter_dir))


def prepare_tokenizer(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Left padding (for batched generation) and a pad token (eos when the checkpoint has none)."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_tokenizer(
    model: PreTrainedModel, name: str | None, trust_remote_code: bool = False
) -> PreTrainedTokenizerBase:
    """The tokenizer saved next to the model, left-padded, with a pad token."""
    source = resolve_model_path(name) if name else model.config.name_or_path
    return prepare_tokenizer(
        AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    )


def wrap_policy(
    model: PreTrainedModel,
    peft_config: Any,
    *,
    gradient_checkpointing: bool = False,
    disable_dropout: bool = False,
) -> PreTrainedModel:
    """Apply LoRA (after k-bit preparation for a quantized base) and the dropout/GC settings."""
    if is_quantized(model) and peft_config is None and not is_peft_model(model):
        raise ValueError(
            "The model is loaded in 4/8-bit, whose base weights cannot be trained: pass a "
            "peft_config (e.g. peft.LoraConfig(r=16, target_modules='all-linear'))."
        )
    if peft_config is not None:
        from peft import get_peft_model, prepare_model_for_kbit_training

        if is_peft_model(model):  # TRL's refusal: peft would stack a second adapter silently
            raise ValueError(
                "You passed a PeftModel together with a peft_config: pass the PeftModel alone, or "
                "merge_and_unload() it and pass the base model with the new peft_config."
            )
        if is_quantized(model):
            model = prepare_model_for_kbit_training(
                model, use_gradient_checkpointing=gradient_checkpointing
            )
        model = get_peft_model(model, lora_config(peft_config))
    if gradient_checkpointing and is_peft_model(model):
        model.enable_input_require_grads()
    if disable_dropout:
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
    return model


def load_policy(
    name_or_path: str,
    *,
    lora: dict[str, Any] | LoraConfig | None = None,
    load_in_4bit: bool = False,
    dtype: torch.dtype | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer, optionally 4-bit NF4 and/or wrapped with LoRA.

    `name_or_path` is a local dir, a Hub id, or `embedded:smollm2-135m-instruct`. `dtype` defaults
    to `default_dtype()`. A 4-bit model without `lora` is returned prepared for k-bit training
    (evaluation of a saved adapter goes through `peft.PeftModel.from_pretrained` on it).
    """
    kwargs = model_init_kwargs({"dtype": dtype or default_dtype()}, load_in_4bit=load_in_4bit)
    model = load_model(name_or_path, kwargs)
    tokenizer = load_tokenizer(model, name_or_path)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    if lora is not None:
        return wrap_policy(model, lora), tokenizer
    if load_in_4bit:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    return model, tokenizer


def load_trainer_policy(
    model: str | PreTrainedModel,
    processing_class: Any,
    peft_config: Any,
    args: Any,
    init_kwargs: dict[str, Any],
    name: str,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """`GRPOTrainer`'s policy and tokenizer: the model loaded when given by `name`, the tokenizer
    prepared (left padding, a pad token), then LoRA, gradient checkpointing, dropout off and the
    float32 LM head as `args` (a `GRPOConfig`) asks."""
    from transformers import set_seed

    if isinstance(model, str):
        model = load_model(model, init_kwargs)
    tokenizer = prepare_tokenizer(
        processing_class or load_tokenizer(model, name or None, args.trust_remote_code)
    )
    set_seed(args.seed)  # LoRA initialisation draws from the global RNG: seed it first
    model = wrap_policy(
        model,
        peft_config,
        gradient_checkpointing=args.gradient_checkpointing,
        disable_dropout=args.disable_dropout,
    )
    if args.cast_lm_head_to_fp32:
        cast_lm_head_to_fp32(model)  # before the reference copy, which inherits it
    warn_on_half_precision_training(model)
    return model, tokenizer


def warn_on_half_precision_training(model: torch.nn.Module) -> None:
    """One warning when trainable weights are bf16 / fp16 (asked for with model_init_kwargs'
    `dtype`, or a model passed in that dtype): with no float32 master copy, an optimizer update
    smaller than half a weight's spacing in that dtype rounds away. LoRA adapters are float32
    (peft) on any base, so a bf16 base with LoRA is silent."""
    half = {p.dtype for p in model.parameters() if p.requires_grad and p.element_size() < 4}
    if half:
        names = "/".join(sorted(str(d).removeprefix("torch.") for d in half))
        logger.warning(
            "The trainable weights are %s: pure %s training, with no float32 master copy, loses "
            "updates smaller than half a weight's spacing (measured: docs/differences-from-trl.md). "
            "For mixed precision (float32 weights, bf16 compute) set bf16=True and drop 'dtype' "
            "from model_init_kwargs, or pass the model in float32.",
            names,
            names,
        )


def build_reference(model: PreTrainedModel, beta: float) -> PreTrainedModel | None:
    """A frozen copy for full fine-tuning with beta > 0; None otherwise (PEFT or beta == 0)."""
    if beta == 0 or is_peft_model(model):
        return None
    if is_quantized(model):
        raise ValueError("beta > 0 on a quantized model needs a LoRA adapter (pass peft_config).")
    ref = copy.deepcopy(model).eval()
    ref.requires_grad_(False)
    return ref


@contextlib.contextmanager
def reference_mode(model: Any, ref_model: Any) -> Iterator[Any]:
    """Yield the module that computes reference log-probs: the frozen copy or adapter-off."""
    if ref_model is not None:
        yield ref_model
    elif is_peft_model(model):
        with model.disable_adapter():
            yield model
    else:
        raise RuntimeError(
            "No reference policy: build_reference returned None for a non-PEFT model."
        )


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) for rollouts, restoring each module's own mode afterwards (set as
    flags: `_compat.set_training_flags`)."""
    flags = training_flags(model)
    set_training_flags(model, False)
    try:
        yield
    finally:
        set_training_flags(model, flags)


def router_aux_loss_coefficient(model: Any, requested: float | None) -> float:
    """The weight of a MoE model's load-balancing loss: `requested`, else the model config's;
    0.0 for a model without router logits (an error when a coefficient was requested for it)."""
    declared = moe_router_config(model)
    if declared is None:
        if requested:
            raise ValueError(
                f"router_aux_loss_coef={requested} is set but {type(unwrap_peft(model)).__name__} "
                "is not a Mixture-of-Experts model that returns router logits; leave it None."
            )
        return 0.0
    return declared if requested is None else float(requested)


@torch.no_grad()
def mix_reference(ref_model: torch.nn.Module, model: torch.nn.Module, alpha: float) -> None:
    """TR-DPO's reference update (https://arxiv.org/abs/2404.09656): ref <- alpha * policy +
    (1 - alpha) * ref, parameter by parameter."""
    policy = dict(unwrap_peft(model).named_parameters())
    for name, ref_param in ref_model.named_parameters():
        ref_param.mul_(1.0 - alpha).add_(policy[name].to(ref_param.dtype), alpha=alpha)
