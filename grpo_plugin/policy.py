"""Build the trainable policy (full, LoRA, or 4-bit QLoRA) and its frozen reference.

The reference for a PEFT policy is the same weights with the adapter disabled: no second copy of
the model. Only full fine-tuning with `beta > 0` pays for a frozen deep copy.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

logger = logging.getLogger(__name__)


def is_peft_model(model: Any) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a dependency
        return False
    return isinstance(model, PeftModel)


def is_quantized(model: Any) -> bool:
    return bool(
        getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)
    )


def _init_kwargs(args: Any) -> dict[str, Any]:
    kwargs = dict(args.model_init_kwargs or {})
    qconf = kwargs.get("quantization_config")
    if isinstance(qconf, dict):
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(**qconf)
    if isinstance(kwargs.get("dtype"), str) and kwargs["dtype"] != "auto":
        kwargs["dtype"] = getattr(torch, kwargs["dtype"])
    if "dtype" not in kwargs:
        kwargs["dtype"] = torch.bfloat16 if args.bf16 else torch.float32
    return kwargs


def load_model(name: str, args: Any) -> PreTrainedModel:
    """`AutoModelForCausalLM.from_pretrained` on a path, Hub id or `embedded:` name."""
    from .models import resolve_model_path

    return AutoModelForCausalLM.from_pretrained(resolve_model_path(name), **_init_kwargs(args))


def load_tokenizer(model: PreTrainedModel, name: str | None):
    """The tokenizer saved next to the model, left-padded, with a pad token."""
    from .models import prepare_tokenizer, resolve_model_path

    source = resolve_model_path(name) if name else model.config.name_or_path
    return prepare_tokenizer(AutoTokenizer.from_pretrained(source))


def wrap_policy(model: PreTrainedModel, peft_config: Any, args: Any) -> PreTrainedModel:
    """Apply LoRA (after k-bit preparation for a quantized base) and the dropout/GC settings."""
    if is_quantized(model) and peft_config is None and not is_peft_model(model):
        raise ValueError(
            "The model is loaded in 4/8-bit, whose base weights cannot be trained: pass a "
            "peft_config (e.g. peft.LoraConfig(r=16, target_modules='all-linear'))."
        )
    if peft_config is not None:
        from peft import get_peft_model, prepare_model_for_kbit_training

        if is_quantized(model):
            model = prepare_model_for_kbit_training(
                model, use_gradient_checkpointing=args.gradient_checkpointing
            )
        model = get_peft_model(model, peft_config)
    if args.gradient_checkpointing:
        args.gradient_checkpointing_kwargs = args.gradient_checkpointing_kwargs or {
            "use_reentrant": False
        }
        if is_peft_model(model):
            model.enable_input_require_grads()
    if args.disable_dropout:
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
    return model


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
    """Eval mode (no dropout) for rollouts, restoring the previous mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
