"""A recipe's checks that need no data, disk or tokenizer: its rewards resolve, the columns they
read exist, the evaluation schedule can work (`preflight.py` does the rest, `recipe.py` parses).

`check_recipe` verifies, before any model is loaded, that the dataset spec is valid, every
reward name resolves, every dataset column a reward reads exists, and the evaluation schedule
can work (a held-out set, an `eval_metrics` hook that imports, a `metric_for_best_model` that is
logged). Every problem raises `RecipeError` with one line that says how to fix it.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import reward_fns

from ..config.grpo_config import GRPOConfig
from ..config.number_checks import check_reward_weights
from ..evaluation.setup import (
    check_eval_options,
    check_eval_setup,
    resolve_eval_metrics,
)
from ..scoring.context import TRAINER_KWARGS
from ..scoring.reward_models import resolve_reward_name
from .data import EVALUATION_ONLY, has_held_out, known_columns, validate_dataset_spec
from .recipe import Recipe, RecipeError, one_line, unknown_key_message

# Arguments of a reward function that never name a dataset column (TRL's contract, with the
# trainer's own keyword arguments: trainer_state, log_extra, log_metric).
_REWARD_CALL_ARGS = {"prompts", "completions", "completion_ids", *TRAINER_KWARGS}
# Reward parameters whose *value* names a column (`column_name="answer"` in the verifiers).
_COLUMN_PARAMS = ("column_name",)
EVAL_KEYS = (
    "reward",
    "k",
    "num_samples",
    "max_new_tokens",
    "batch_size",
    "temperature",
    "success_threshold",
    "before",
    "cache",
    "seed",
)


def reward_specs(items: Sequence[Any]) -> list[tuple[str | Callable, dict[str, Any]]]:
    """`(name, params)` per reward entry; `{name, params}` dicts and plain names both work."""
    specs = []
    for item in items:
        if isinstance(item, dict):
            extra = set(item) - {"name", "params"}
            if "name" not in item or extra:
                raise RecipeError(
                    f"reward entry {item!r} must look like {{name: NAME, params: {{...}}}}"
                    + (f"; unexpected key(s) {sorted(extra)}" if extra else "")
                )
            params = item.get("params") or {}
            if not isinstance(params, dict):
                raise RecipeError(
                    f"reward {item['name']!r}: params must be a mapping, got {params!r}"
                )
            specs.append((item["name"], dict(params)))
        elif isinstance(item, str) or callable(item):
            specs.append((item, {}))
        else:
            raise RecipeError(f"reward entry {item!r} must be a name or {{name, params}}")
    if not specs:
        raise RecipeError("reward_funcs is empty; name at least one reward (grpo-plugin rewards)")
    return specs


def _fill_from_config(fn: Callable, params: dict[str, Any], config: GRPOConfig) -> dict[str, Any]:
    """A reward parameter named like a GRPOConfig field (e.g. `max_completion_length` of
    `soft_overlong`) defaults to the config's value when the recipe leaves it out."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return params
    filled = dict(params)
    for name, param in sig.parameters.items():
        if name not in filled and param.default is None and hasattr(config, name):
            if name not in _REWARD_CALL_ARGS and name in {
                f.name for f in dataclasses.fields(config)
            }:
                filled[name] = getattr(config, name)
    return filled


def resolve_rewards(recipe: Recipe, specs: list | None = None) -> list[Callable]:
    """Every reward resolved through `reward_fns.resolve` (unknown names -> RecipeError)."""
    resolved = []
    base = Path(recipe.source).parent if recipe.source else None  # files next to the recipe
    for name, params in reward_specs(recipe.args.reward_funcs) if specs is None else specs:
        try:
            fn = resolve_reward_name(name, base) if isinstance(name, str) else name
            resolved.append(reward_fns.resolve(fn, **_fill_from_config(fn, params, recipe.config)))
        except (KeyError, ValueError, TypeError, ImportError, AttributeError) as err:
            raise RecipeError(one_line(err)) from err
    return resolved


def required_columns(fn: Callable) -> set[str]:
    """Dataset columns a reward reads: its parameters without a default (beyond TRL's call
    arguments), the value of a `column_name` parameter, and a `required_columns` attribute."""
    columns = set(getattr(fn, "required_columns", ()) or ())
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return columns
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    for name, param in sig.parameters.items():
        if name in _REWARD_CALL_ARGS or param.kind in variadic:
            continue
        if param.default is inspect.Parameter.empty:
            columns.add(name)
        elif name in _COLUMN_PARAMS and isinstance(param.default, str):
            columns.add(param.default)
    return columns


def check_reward_columns(rewards: list[Callable], columns: Sequence[str], where: str) -> None:
    """Every dataset column a reward reads must exist (`where` names the data in the message)."""
    for fn in rewards:
        missing = sorted(required_columns(fn) - set(columns))
        if missing:
            name = reward_fns.reward_name(fn)
            raise RecipeError(
                f"reward {name!r} needs dataset column(s) {missing}, but {where} has "
                f"{sorted(columns)}; rename your gold column or pass params: {{column_name: ...}}"
            )


def check_eval_spec(recipe: Recipe) -> dict[str, Any]:
    """The `eval` section: known keys, values `evaluate` takes, `before` a boolean and a
    `reward` that resolves, whose columns the dataset has (when they are known)."""
    spec = dict(recipe.args.eval or {})
    for key in spec:
        if key not in EVAL_KEYS:
            raise RecipeError(unknown_key_message(key, EVAL_KEYS, "eval"))
    try:
        check_eval_options(spec, name=lambda key: f"eval.{key}")
    except ValueError as err:
        raise RecipeError(one_line(err)) from err
    for key in ("before", "cache"):
        if not isinstance(spec.get(key, True), bool):
            raise RecipeError(f"eval.{key}={spec[key]!r} must be true or false")
    if spec.get("reward") is not None:
        reward = resolve_rewards(recipe, reward_specs([spec["reward"]]))
        columns = known_columns(recipe.args.dataset)
        if columns is not None:
            check_reward_columns(reward, columns, "the dataset")
    return spec


def eval_metrics_fn(recipe: Recipe) -> Callable | None:
    """The recipe's `eval_metrics` hook, resolved (a file path is relative to the recipe)."""
    base = Path(recipe.source).parent if recipe.source else None
    try:
        return resolve_eval_metrics(recipe.args.eval_metrics, base_dir=base)
    except ValueError as err:
        raise RecipeError(one_line(err)) from err


def check_evaluation(recipe: Recipe, rewards: list[Callable]) -> None:
    """A scheduled evaluation needs a held-out or validation set; the best-model metric must be
    logged; the best model is chosen on a validation split, never on the reported test set."""
    hook = eval_metrics_fn(recipe)
    spec = recipe.args.dataset
    validation = bool(spec.get("validation_size"))
    if recipe.config.load_best_model_at_end and not validation:
        raise RecipeError(
            "load_best_model_at_end would choose the checkpoint on the held-out set that the "
            "run reports; add `validation_size: N` to the recipe's dataset to choose it on a "
            "validation split of its own"
        )
    sets = [""] if validation or has_held_out(spec) else None
    names = [reward_fns.reward_name(fn) for fn in rewards]
    try:
        check_eval_setup(recipe.config, sets, names, hook is not None)
    except ValueError as err:
        raise RecipeError(one_line(err)) from err


def recipe_tools(recipe: Recipe) -> list[Callable]:
    """The recipe's tools as callables (names resolved relative to the recipe), schemas checked,
    and what the trainer refuses next to tools (`overlap_scoring`, `auto_find_batch_size`)."""
    from ..training.sampling.tool_inputs import ToolInputs, resolve_tool

    base = Path(recipe.source).parent if recipe.source else None
    try:
        callables = [resolve_tool(spec, base) for spec in recipe.args.tools or []]
        ToolInputs.check(callables, None, None, recipe.config)
    except ValueError as err:
        raise RecipeError(one_line(err)) from err
    return callables


def recipe_model_kwargs(recipe: Recipe) -> dict[str, Any]:
    """The recipe's `model_init_kwargs`, with NF4 quantization when `load_in_4bit`."""
    from ..models.policy import nf4_quantization

    kwargs = dict(recipe.config.model_init_kwargs or {})
    if recipe.args.load_in_4bit:
        compute = "bfloat16" if recipe.config.bf16 else "float32"
        kwargs = {"quantization_config": nf4_quantization(compute), **kwargs}
    return kwargs


def check_model_setup(recipe: Recipe) -> None:
    """The `lora` section, `model_init_kwargs` and a rollout copy against the load to come, as
    the trainer checks them (`models/setup_checks.py`), but before the data is read."""
    from ..models.policy import lora_config, model_init_kwargs
    from ..models.setup_checks import (
        check_copy_setup,
        check_reference_setup,
        check_train_precision_setup,
    )

    try:
        peft = lora_config(recipe.args.lora) if recipe.args.lora is not None else None
        init = model_init_kwargs(recipe_model_kwargs(recipe), bf16=bool(recipe.config.bf16))
        check_copy_setup(recipe.config, peft, init)
        check_train_precision_setup(recipe.config, peft, init)
        check_reference_setup(recipe.config, peft)
    except (TypeError, ValueError) as err:
        raise RecipeError(one_line(err)) from err


def check_recipe(recipe: Recipe) -> list[Callable]:
    """Everything that can be checked without a model; returns the resolved rewards."""
    if recipe.args.load_in_4bit and recipe.args.lora is None:
        raise RecipeError(
            "load_in_4bit needs a `lora` section: 4-bit base weights cannot be trained"
        )
    check_model_setup(recipe)
    try:
        validate_dataset_spec(recipe.args.dataset)
    except (ValueError, TypeError) as err:
        raise RecipeError(one_line(err)) from err
    name = recipe.args.dataset.get("name")
    if name in EVALUATION_ONLY:
        raise RecipeError(
            f"dataset: {name} is an evaluation set, not training data (training on a test set "
            f"makes its numbers meaningless); evaluate a run on it with `grpo-plugin eval "
            f"--dataset {name} --reward code_tests --adapter OUTPUT_DIR`, train on e.g. "
            "`dataset: {name: code}`"
        )
    rewards = resolve_rewards(recipe)
    try:  # a recipe has no environment rewards: all-zero weights would learn nothing
        check_reward_weights(recipe.config.reward_weights, len(rewards))
    except ValueError as err:
        raise RecipeError(one_line(err)) from err
    columns = known_columns(recipe.args.dataset)
    if columns is not None:
        check_reward_columns(rewards, columns, "the dataset")
    check_eval_spec(recipe)
    check_evaluation(recipe, rewards)
    recipe_tools(recipe)
    _check_liger(recipe)
    return rewards


def _check_liger(recipe: Recipe) -> None:
    """`use_liger_kernel`, as the trainer decides it (its ImportError too), in one line now."""
    if not recipe.config.use_liger_kernel:
        return
    from ..models.liger import check_liger
    from ..models.policy import lora_config

    try:
        lora = lora_config(recipe.args.lora) if recipe.args.lora is not None else None
        check_liger(recipe.config, None, lora)
    except (ImportError, TypeError, ValueError) as err:
        raise RecipeError(one_line(err)) from err
