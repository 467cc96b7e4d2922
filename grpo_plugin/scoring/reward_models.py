"""Reward models: a sequence classifier (one logit) used as a reward function, as in TRL.

`reward_funcs` entries may be functions, registered reward names, `module:function` paths, or
reward models: a loaded `PreTrainedModel` or a Hub id / local directory, loaded with
`AutoModelForSequenceClassification(num_labels=1)` and `GRPOConfig.model_init_kwargs` (so a
4-bit policy asked for with a `quantization_config` gets a 4-bit reward model too).
`reward_processing_classes` follows TRL's rules: one tokenizer, or a list aligned with
`reward_funcs` whose entries for functions are ignored; a missing tokenizer is loaded from the
reward model's name; a tokenizer without a pad token pads with EOS.

A `RewardModel` scores `prompt + completion` texts in batches under `inference_mode`; chat prompts
are rendered with the *reward* tokenizer's own chat template. It is named in metrics and on the
model card by the last part of its model name (`rewards/<name>/mean`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

import reward_fns

from ..models.embedded import resolve_model_path
from ..user_code.callables import load_callable

HUB_ID = re.compile(r"^[\w.\-]+/[\w.\-]+$")
SCORING_BATCH = 64  # rows per reward-model forward


class RewardModelError(ValueError):
    """A reward model cannot be used; the message says why and what to pass instead."""


class RewardModel:
    """A sequence-classification model as a TRL-style reward function (one float per completion)."""

    runs_in_process = True  # our forward, on the trainer's device: never in the worker process

    def __init__(self, model: torch.nn.Module, tokenizer: Any, source: str | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.source = source or getattr(model.config, "name_or_path", "") or type(model).__name__
        self.__name__ = model_display_name(model)
        self.chat_template_kwargs: dict[str, Any] = {}
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        # The classifier scores the last non-pad token, found through the config's pad id.
        config = model.config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        text_config.pad_token_id = tokenizer.pad_token_id
        model.eval().requires_grad_(False)

    def texts(self, prompts: list[Any], completions: list[Any]) -> list[str]:
        """`prompt + completion`; chat messages through the reward tokenizer's chat template."""
        if prompts and isinstance(prompts[0], list):
            return [
                self.tokenizer.apply_chat_template(
                    p + c, tokenize=False, **self.chat_template_kwargs
                )
                for p, c in zip(prompts, completions)
            ]
        return [p + c for p, c in zip(prompts, completions)]

    @torch.inference_mode()
    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        texts = self.texts(prompts, completions)
        device = next(self.model.parameters()).device
        scores: list[float] = []
        for start in range(0, len(texts), SCORING_BATCH):
            batch = self.tokenizer(
                texts[start : start + SCORING_BATCH],
                return_tensors="pt",
                padding=True,
                padding_side="right",
                add_special_tokens=False,
            ).to(device)
            scores += self.model(**batch).logits[:, 0].float().tolist()  # (B,)
        return scores


def model_display_name(model: torch.nn.Module) -> str:
    """TRL's metric name of a reward model: the last part of its model id (else its class)."""
    name = str(getattr(model.config, "name_or_path", "") or "").rstrip("/")
    return name.split("/")[-1] or type(model).__name__


def is_reward_model_name(name: str) -> bool:
    """A string that names a model rather than a reward function: a local dir or 'org/name'."""
    return os.path.isdir(name) or bool(HUB_ID.match(name))


def check_classifier_architecture(source: str, trust_remote_code: bool = False) -> None:
    """Fail before any weights load when `source`'s config declares no sequence-classification
    architecture (e.g. a causal LM: its score head would be random)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise RewardModelError(
            f"reward_funcs entry {source!r} is neither a registered reward nor a loadable reward "
            f"model (no local directory; Hub: {' '.join(str(err).split())[:200]})."
        ) from err
    archs = getattr(config, "architectures", None) or []
    if archs and not any(a.endswith("ForSequenceClassification") for a in archs):
        raise RewardModelError(
            f"reward model {source!r} has no sequence-classification head (architectures: "
            f"{', '.join(archs)}): it would score with a randomly initialised head. Pass a "
            "checkpoint trained as AutoModelForSequenceClassification(num_labels=1), or a function."
        )


def load_reward_model(
    name: str, init_kwargs: dict[str, Any] | None = None, trust_remote_code: bool = False
) -> torch.nn.Module:
    """`AutoModelForSequenceClassification(num_labels=1)` from a Hub id or local dir, checked to
    have a trained classification head."""
    from transformers import AutoModelForSequenceClassification

    source = resolve_model_path(name)
    check_classifier_architecture(source, trust_remote_code)
    kwargs = {**(init_kwargs or {}), "trust_remote_code": trust_remote_code}
    try:
        model, info = AutoModelForSequenceClassification.from_pretrained(
            source, num_labels=1, output_loading_info=True, **kwargs
        )
    except (OSError, RuntimeError, ValueError) as err:
        raise RewardModelError(
            f"reward model {name!r} could not be loaded as a sequence classifier with one output "
            f"(num_labels=1): {' '.join(str(err).split())[:300]}"
        ) from err
    prefix = getattr(model, "base_model_prefix", "model")
    untrained_head = [k for k in info.get("missing_keys", []) if not k.startswith(prefix + ".")]
    if untrained_head:
        raise RewardModelError(
            f"reward model {name!r} has no trained sequence-classification head (missing "
            f"{', '.join(sorted(untrained_head))}); pass a reward-model checkpoint, not a base model."
        )
    return model


def _processing_class_list(classes: Any, count: int) -> list[Any]:
    if classes is None:
        return [None] * count
    classes = classes if isinstance(classes, (list, tuple)) else [classes]
    if len(classes) != count:
        raise ValueError(
            f"The number of reward processing classes ({len(classes)}) must match the number of "
            f"reward functions ({count}); give one per entry of reward_funcs (None for functions)."
        )
    return list(classes)


def resolve_reward_name(name: str, base_dir: str | Path | None = None) -> Callable:
    """A reward named by the user: 'module:function' or 'file.py:function' through the one loader
    of user code (`user_code.load_callable`: next to the recipe, `base_dir`, or in the working
    directory), anything else through the registry (names, dotted paths, entry points)."""
    if ":" in name:
        return load_callable(name, "reward", base_dir)
    return reward_fns.resolve(name)


def resolve_reward_funcs(
    reward_funcs: Any,
    reward_processing_classes: Any = None,
    init_kwargs: dict[str, Any] | None = None,
) -> list[Callable]:
    """Every entry of `reward_funcs` as a callable: functions as they are, names through the reward
    registry, models (loaded or by name, with `init_kwargs`) as `RewardModel`s."""
    trust_remote_code = bool((init_kwargs or {}).get("trust_remote_code", False))
    if reward_funcs is None:
        raise ValueError(
            "No reward source provided: pass reward_funcs (a reward function, a registered reward "
            "name, a reward model by Hub id, local directory or loaded, or a list of these), or an "
            "environment_factory whose environment defines get_reward."
        )
    funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    if not funcs:
        raise ValueError(
            "No reward source provided: reward_funcs is empty; pass at least one reward "
            "function or name."
        )
    classes = _processing_class_list(reward_processing_classes, len(funcs))
    return [_resolve_one(f, c, init_kwargs, trust_remote_code) for f, c in zip(funcs, classes)]


def _resolve_one(entry, tokenizer, init_kwargs, trust_remote_code) -> Callable:
    if isinstance(entry, torch.nn.Module):
        _check_loaded_classifier(entry)
        return RewardModel(entry, tokenizer or _load_tokenizer(entry, trust_remote_code))
    if callable(entry):
        return entry
    if isinstance(entry, os.PathLike):
        entry = os.fspath(entry)
    if not isinstance(entry, str):
        raise TypeError(f"reward_funcs entries must be callables, names or models; got {entry!r}.")
    if not (os.path.isdir(entry) and entry not in reward_fns.available()):
        try:
            return resolve_reward_name(entry)
        except reward_fns.UnknownRewardError:
            if not is_reward_model_name(entry):
                raise
    model = load_reward_model(entry, init_kwargs, trust_remote_code)
    return RewardModel(model, tokenizer or _load_tokenizer(model, trust_remote_code), entry)


def _check_loaded_classifier(model: torch.nn.Module) -> None:
    if not type(model).__name__.endswith("ForSequenceClassification"):
        raise RewardModelError(
            f"a {type(model).__name__} in reward_funcs is not a sequence-classification model; a "
            "reward model must be loaded with AutoModelForSequenceClassification(num_labels=1)."
        )


def _load_tokenizer(model: torch.nn.Module, trust_remote_code: bool) -> Any:
    from transformers import AutoTokenizer

    source = getattr(model.config, "name_or_path", None)
    if not source:
        raise RewardModelError(
            f"reward model {type(model).__name__} has no name to load its tokenizer from; pass "
            "reward_processing_classes=<its tokenizer>."
        )
    return AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)


def is_reward_model(func: Callable) -> bool:
    return isinstance(func, RewardModel)


def reward_models(funcs: Sequence[Callable]) -> list[RewardModel]:
    return [f for f in funcs if isinstance(f, RewardModel)]


def place_reward_models(
    funcs: Sequence[Callable], device: torch.device | str, chat_template_kwargs: dict | None = None
) -> None:
    """Move each (not quantized) reward model to the policy's device; give it the chat template
    kwargs of the policy's prompts."""
    for rm in reward_models(funcs):
        rm.chat_template_kwargs = dict(chat_template_kwargs or {})
        quantized = getattr(rm.model, "is_loaded_in_4bit", False) or getattr(
            rm.model, "is_loaded_in_8bit", False
        )
        if not quantized:
            rm.model.to(device)
