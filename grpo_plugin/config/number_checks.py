"""The numbers of a `GRPOConfig`: each number field holds a number, a finite one, and the
optimizer's and the reward weights' numbers are in range. Plain functions of one config, called
by `GRPOConfig.__post_init__` before transformers' `TrainingArguments.__post_init__` (which would
otherwise fail on them with a bare `int(nan)` or not at all: `--reward_weights nan` trained
nothing, every advantage 0, and exited 0).

Every error is one line: the field, its value, and what to set instead.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from functools import cache
from typing import Any

# Float fields whose infinite value (of this sign) is a real setting, "no bound"; any other
# infinity, and NaN everywhere, is refused.
INF, NEG_INF = float("inf"), float("-inf")
UNBOUNDED = {
    "max_grad_norm": INF,  # no gradient clipping
    "epsilon_high": INF,  # no upper clip
    "delta": INF,  # no two-sided clip
    "off_policy_mask_threshold": INF,  # no sequence masked
    "sampling_correction_clip_max": INF,  # no upper bound on the ratio
    "vllm_importance_sampling_clip_max": INF,
    "vllm_importance_sampling_cap": INF,
    "entropy_coef_max": INF,
    "entropy_coef_min": NEG_INF,
}


@dataclasses.dataclass(frozen=True)
class NumberField:
    """A field typed as a number: 'int' or 'float', and whether None is allowed."""

    kind: str
    optional: bool
    default: Any


@cache
def number_fields(cls: type) -> dict[str, NumberField]:
    """`{name: NumberField}` for the init fields of `cls` typed int, float or either (optional
    or not); a union with anything else (`int | str`) is not a number field."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        annotation = hints[f.name]
        union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
        members = set(typing.get_args(annotation)) if union else {annotation}
        optional = type(None) in members or f.default is None
        members.discard(type(None))
        if members == {int}:
            out[f.name] = NumberField("int", optional, f.default)
        elif members and members <= {int, float}:
            out[f.name] = NumberField("float", optional, f.default)
    return out


def _is_number(value: Any, kind: str) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (kind == "float" and isinstance(value, float))


def check_number_fields(config: Any) -> None:
    """A field typed `int` or `float` holds a number (None where it is optional), and a finite
    one unless infinity means "no bound" there (`UNBOUNDED`): `temperature=None`,
    `num_generations="8"` or `beta=nan` would otherwise fail later, or silently."""
    for name, field in number_fields(type(config)).items():
        value = getattr(config, name)
        if value is None and field.optional:
            continue
        example = f"; e.g. {name}={field.default!r}" if field.default is not None else " or None"
        if not _is_number(value, field.kind):
            word = "an integer" if field.kind == "int" else "a number"
            raise ValueError(f"{name}={value!r} must be {word}{example}.")
        if isinstance(value, float) and not math.isfinite(value) and UNBOUNDED.get(name) != value:
            raise ValueError(f"{name}={value!r} must be a finite number{example}.")
    # all zero is allowed here: environments' rewards (weight 1) may be what is learned
    check_reward_weights(config.reward_weights, all_zero_ok=True)
    check_optimizer_numbers(config)
    check_counts(config)


def check_counts(config: Any) -> None:
    """Counts that must be positive, where 0 was taken silently (`max_prompt_length=0` trained on
    empty prompts; `max_steps=0` trained `num_train_epochs` epochs, and with 0 epochs nothing) or
    failed once the model had loaded (a batch size of 0)."""
    for name in ("per_device_train_batch_size", "gradient_accumulation_steps"):
        if getattr(config, name) < 1:
            raise ValueError(f"{name}={getattr(config, name)} must be >= 1.")
    for name in ("steps_per_generation", "generation_batch_size", "max_prompt_length"):
        value = getattr(config, name)
        if value is not None and value < 1:
            raise ValueError(f"{name}={value} must be >= 1, or None (see its help).")
    for name in ("seed", "data_seed"):  # numpy's legacy seeding, in transformers' set_seed
        value = getattr(config, name)
        if value is not None and not 0 <= value < 2**32:
            raise ValueError(f"{name}={value} must be in [0, 2**32 - 1] (numpy seeds with it).")
    if config.dataloader_num_workers < 0:
        raise ValueError(f"dataloader_num_workers={config.dataloader_num_workers} must be >= 0.")
    _check_intervals(config)
    if config.max_steps == 0:
        raise ValueError(
            "max_steps=0 would train num_train_epochs epochs (transformers reads <= 0 as unset); "
            "give a positive number of steps, or -1 to train num_train_epochs epochs."
        )
    if config.max_steps < 0 and not config.num_train_epochs > 0:
        raise ValueError(
            f"num_train_epochs={config.num_train_epochs} with max_steps={config.max_steps} "
            "trains nothing; set max_steps > 0 or num_train_epochs > 0."
        )


def _check_intervals(config: Any) -> None:
    """Step intervals: a negative `logging_steps` never logged (metrics.jsonl stayed empty) and
    `save_steps` 0 never saved, both silently; `eval_steps` 0 meant "unset"."""
    strategies = {"logging_steps": "logging_strategy", "save_steps": "save_strategy"}
    strategies["eval_steps"] = "eval_strategy"
    for name, strategy in strategies.items():
        value, kind = getattr(config, name), getattr(config, strategy)
        if value is not None and str(getattr(kind, "value", kind)) == "steps" and value <= 0:
            raise ValueError(
                f"{name}={value} must be > 0 with {strategy}='steps' (a number of steps, or a "
                "fraction of the run below 1)."
            )


def check_reward_weights(
    weights: Any, num_funcs: int | None = None, *, all_zero_ok: bool = False
) -> None:
    """`reward_weights`: None, or a list of finite numbers (one per reward function when
    `num_funcs` is given), not all zero unless `all_zero_ok` (other rewards are learned): with
    every weight 0 (or NaN) every advantage is 0 and nothing is learned, while the run looks
    healthy."""
    if weights is None:
        return
    if not isinstance(weights, (list, tuple)):
        raise ValueError(
            f"reward_weights={weights!r} must be a list with one number per reward function, "
            "e.g. reward_weights=[1.0, 0.25]."
        )
    for i, weight in enumerate(weights):
        if not _is_number(weight, "float") or not math.isfinite(weight):
            raise ValueError(
                f"reward_weights[{i}]={weight!r} must be a finite number (a NaN or infinite weight "
                "makes every advantage 0 or NaN); e.g. reward_weights=[1.0, 0.25]."
            )
    if num_funcs is not None and len(weights) != num_funcs:
        raise ValueError(
            f"reward_weights has {len(weights)} entries for {num_funcs} reward functions; give "
            "one each."
        )
    if weights and not any(weights) and not all_zero_ok:
        raise ValueError(
            f"reward_weights={list(weights)} are all 0: every advantage would be 0 and nothing "
            "learned; give the reward that should be learned a non-zero weight."
        )


def check_optimizer_numbers(config: Any) -> None:
    """What torch's Adam/AdamW refuses only when the Trainer builds it, after the model loaded."""
    if "adam" not in str(getattr(config.optim, "value", config.optim)):
        return
    for i, beta in enumerate((config.adam_beta1, config.adam_beta2), 1):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"adam_beta{i}={beta} must be in [0, 1) (defaults: 0.9, 0.999).")
    if config.adam_epsilon < 0:
        raise ValueError(f"adam_epsilon={config.adam_epsilon} must be >= 0 (default 1e-8).")
    if config.weight_decay < 0:
        raise ValueError(f"weight_decay={config.weight_decay} must be >= 0 (0.0: none).")
