"""Recipes: a YAML file of `GRPOConfig` fields plus `model`, `dataset`, `reward_funcs`, `lora`,
`load_in_4bit`, `eval`, `eval_metrics` and `tools`, with command-line flags on top.

Parsing goes through `transformers.HfArgumentParser` over `(RecipeArguments, GRPOConfig)`:
flags are parsed by it (types, `--no_x` booleans, help text), merged over the YAML, and the merged
dict goes to `parse_dict(..., allow_extra_keys=False)`. Dict-valued recipe keys also take dotted
flags: `--dataset.path data/train.jsonl`, `--eval.k 4`, `--lora.r 8` (values are read as YAML).

A recipe is then checked (`recipe_checks.check_recipe`, `preflight.prepare_run`) before any model
loads; every problem raises `RecipeError` with one line that says how to fix it, which the CLI
prints before exiting with code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from transformers import HfArgumentParser

from ..config.grpo_config import GRPOConfig
from .recipe_library import find_recipe
from .recipe_types import coerce_values, field_types
from .yaml_input import YAMLTooLarge, safe_load

DICT_FIELDS = ("dataset", "lora", "eval")


class RecipeError(ValueError):
    """A recipe that cannot run; the message is one line saying how to fix it."""


@dataclass
class RecipeArguments:
    """What a recipe adds to `GRPOConfig`: the model, the data, the rewards and the evaluation."""

    model: str = field(
        default="embedded:smollm2-135m-instruct",
        metadata={
            "help": "Policy: 'embedded:smollm2-135m-instruct' (no download), a local dir or a Hub id."
        },
    )
    dataset: dict[str, Any] | str | None = field(
        default=None,
        metadata={
            "help": "Dataset spec (see grpo_plugin.data): {name: arithmetic|gsm8k} or {path: FILE}, "
            "plus split, eval_path, train_size, eval_size, seed, low, high, template, system_prompt."
        },
    )
    reward_funcs: list[str] = field(
        default_factory=lambda: ["last_integer"],
        metadata={
            "help": "Reward functions: registry names, 'module:function' paths, or (in YAML) "
            "{name: NAME, params: {...}}. The first one is the accuracy reward for evaluation."
        },
    )
    lora: dict[str, Any] | str | None = field(
        default=None,
        metadata={
            "help": "peft.LoraConfig arguments, e.g. {r: 16, lora_alpha: 32, target_modules: "
            "all-linear}. null: full fine-tuning."
        },
    )
    load_in_4bit: bool = field(
        default=False,
        metadata={"help": "Load the base model in 4-bit NF4 (bitsandbytes); needs `lora` (QLoRA)."},
    )
    eval: dict[str, Any] | str | None = field(
        default=None,
        metadata={
            "help": "Held-out evaluation before and after training: {k: 8 (pass@k; 0 = off), "
            "num_samples, max_new_tokens (default max_completion_length), batch_size, "
            "temperature, reward (default: the first reward), before: true}."
        },
    )
    eval_metrics: str | None = field(
        default=None,
        metadata={
            "help": "Task metrics at every evaluation: 'module:function' or 'file.py:function' "
            "(relative to the recipe), called with the greedy completions, prompts and dataset "
            "columns; returns {name: number}, logged as eval_<name>."
        },
    )
    report: bool = field(
        default=True,
        metadata={
            "help": "Write report.html at the end: the curve, the evaluations and every logged "
            "completion by step and group (`grpo-plugin report RUN_DIR` writes it any time)."
        },
    )
    tools: list[str] | None = field(
        default=None,
        metadata={
            "help": "Tools the model may call (multi-turn): 'python' (the built-in sandboxed "
            "interpreter), 'module:function' or 'file.py:function' (relative to the recipe); "
            "typed functions with Google-style docstrings. Needs chat prompts."
        },
    )


@dataclass
class Recipe:
    """A parsed recipe: its arguments, its GRPOConfig and the merged dict it came from."""

    args: RecipeArguments
    config: GRPOConfig
    raw: dict[str, Any]
    source: str | None = None


def recipe_parser(
    prog: str = "grpo-plugin train RECIPE.yaml", typed_only: bool = False
) -> HfArgumentParser:
    """The `HfArgumentParser` whose flags (and `--help`) cover every recipe key; `typed_only`:
    one whose namespace holds only the flags a user typed (`parse_overrides`)."""
    kind = _TypedFlagsParser if typed_only else _RecipeFlagsParser
    parser = kind((RecipeArguments, GRPOConfig), prog=prog, allow_abbrev=False)
    parser.error = _raise_parse_error  # one line, not usage + error
    return parser


# argparse (before 3.13) takes "-1e-4" for a flag ("expected one argument"): only "-1" and "-.5"
# looked like numbers to it. No recipe flag looks like a number, so every number is a value.
_NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-(inf|infinity|nan)$", re.I)


class _RecipeFlagsParser(HfArgumentParser):
    """The recipe's flags, where a negative number in any notation is a value."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = _NEGATIVE_NUMBER  # argparse's own hook, on this parser


class _TypedFlagsParser(_RecipeFlagsParser):
    """Every argument's default is `argparse.SUPPRESS`: argparse leaves a flag the user did not
    type out of the namespace, so only what was typed comes back (not the fields' defaults)."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        return super().add_argument(*args, **{**kwargs, "default": argparse.SUPPRESS})


_FLAG_TYPE = re.compile(r"argument --(\w+)\S*: invalid (int|float|string_to_bool) value: (.*)")
_TYPE_WORDS = {"int": "an integer", "float": "a number", "string_to_bool": "true or false"}


def _raise_parse_error(message: str) -> None:
    bad = _FLAG_TYPE.match(message)  # argparse's "argument --max_steps/--max-steps: invalid ..."
    if bad:
        name, kind, value = bad.groups()
        message = f"{name} must be {_TYPE_WORDS[kind]}, got {value} (flag --{name})."
    raise RecipeError(message)


def recipe_keys() -> set[str]:
    return {
        f.name for cls in (RecipeArguments, GRPOConfig) for f in dataclasses.fields(cls) if f.init
    }


# TRL's script arguments (`ScriptArguments`, `ModelConfig` in trl/scripts) -> where a recipe
# says the same thing.
TRL_KEYS = {
    "model_name_or_path": "`model: NAME_OR_DIR`",
    "dataset_name": "`dataset: {name: NAME}` (or {path: FILE})",
    "dataset_config": "`dataset: {name: NAME}`",
    "dataset_train_split": "`dataset: {split: SPLIT}`",
    "dataset_test_split": "`dataset: {eval_path: FILE}` or `dataset: {eval_size: N}`",
    "use_peft": "`lora: {r: 16, lora_alpha: 32}`",
    "lora_r": "`lora: {r: N}`",
    "lora_alpha": "`lora: {lora_alpha: N}`",
    "lora_dropout": "`lora: {lora_dropout: X}`",
    "lora_target_modules": "`lora: {target_modules: [...]}`",
    "lora_modules_to_save": "`lora: {modules_to_save: [...]}`",
    "lora_task_type": "`lora: {task_type: ...}`",
    "use_rslora": "`lora: {use_rslora: true}`",
    "use_dora": "`lora: {use_dora: true}`",
    "dtype": "`model_init_kwargs: {dtype: bfloat16}`",
    "torch_dtype": "`model_init_kwargs: {dtype: bfloat16}`",
    "attn_implementation": "`model_init_kwargs: {attn_implementation: ...}`",
    "model_revision": "`model_init_kwargs: {revision: ...}`",
}


def unknown_key_message(key: str, known: Sequence[str], where: str = "recipe") -> str:
    """One line: the unknown key, the recipe's name for a TRL script argument, or the closest
    known key."""
    if where in ("recipe", "flag") and key in TRL_KEYS:
        return (
            f"unknown {where} key {key!r}: that is TRL's script argument; a recipe says "
            f"{TRL_KEYS[key]} (`grpo-plugin train --help` lists every key)"
        )
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown {where} key {key!r}{hint} (`grpo-plugin train --help` lists every key)"


def one_line(err: BaseException | str) -> str:
    """An error message squeezed onto one line."""
    return " ".join(str(err).split()) or type(err).__name__


# ----------------------------------------------------------------------------- loading


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A recipe file (or a built-in recipe's name, see `grpo-plugin recipes`) as a dict."""
    try:
        path = find_recipe(path)
    except OSError as err:  # not found, or a folder
        raise RecipeError(one_line(err)) from err
    try:
        data = safe_load(path.read_text(encoding="utf-8"), f"recipe {path}") or {}
    except YAMLTooLarge as err:
        raise RecipeError(str(err)) from err
    except UnicodeDecodeError as err:
        raise RecipeError(
            f"{path}: not a UTF-8 text file ({err.reason} at byte {err.start})"
        ) from err
    except OSError as err:
        raise RecipeError(f"{path}: cannot be read ({err.strerror})") from err
    except yaml.YAMLError as err:
        raise RecipeError(f"{path}: invalid YAML: {one_line(err)}") from err
    if not isinstance(data, dict):
        raise RecipeError(
            f"{path}: a recipe must be a mapping of keys to values, got {type(data).__name__}"
        )
    return data


def _split_dotted(flags: Sequence[str]) -> tuple[list[str], list[tuple[str, str, str]]]:
    """Pull `--dataset.path VALUE` (or `--dataset.path=VALUE`) out of the flags."""
    rest, dotted, i = [], [], 0
    flags = list(flags)
    while i < len(flags):
        flag = flags[i]
        head = flag[2:].split("=", 1)[0] if flag.startswith("--") else ""
        if "." in head and head.split(".", 1)[0] in DICT_FIELDS:
            top, sub = head.split(".", 1)
            if "=" in flag:
                value = flag.split("=", 1)[1]
            elif i + 1 < len(flags):
                value, i = flags[i + 1], i + 1
            else:
                raise RecipeError(f"{flag} needs a value")
            dotted.append((top, sub, value))
        else:
            rest.append(flag)
        i += 1
    return rest, dotted


def parse_overrides(flags: Sequence[str]) -> dict[str, Any]:
    """The recipe keys given on the command line, typed by HfArgumentParser (nothing else)."""
    flags, dotted = _split_dotted(flags)
    namespace, unknown = recipe_parser(typed_only=True).parse_known_args(flags)
    if unknown:
        flag = next((u for u in unknown if u.startswith("-")), unknown[0])
        if not flag.startswith("-"):
            raise RecipeError(f"unexpected argument {flag!r}; overrides look like --key value")
        raise RecipeError(
            unknown_key_message(
                flag.lstrip("-").split("=")[0].replace("-", "_"), recipe_keys(), "flag"
            )
        )
    overrides = vars(namespace)
    for top, sub, value in dotted:
        overrides.setdefault(f"{top}.", []).append((sub, _flag_yaml(f"--{top}.{sub}", value)))
    return overrides


def _flag_yaml(flag: str, value: str) -> Any:
    """A flag's value read as YAML (bounded: `yaml_input.py`)."""
    try:
        return safe_load(value, flag)
    except YAMLTooLarge as err:
        raise RecipeError(str(err)) from err
    except yaml.YAMLError as err:
        raise RecipeError(f"{flag}: cannot parse {value!r} as YAML: {one_line(err)}") from err


def _as_mapping(key: str, value: Any) -> dict[str, Any] | None:
    if isinstance(value, str):
        try:
            value = safe_load(value, key)
        except YAMLTooLarge as err:
            raise RecipeError(str(err)) from err
        except yaml.YAMLError as err:
            raise RecipeError(
                f"{key}: cannot parse {value!r} as a mapping: {one_line(err)}"
            ) from err
    if value is not None and not isinstance(value, dict):
        raise RecipeError(f"{key} must be a mapping (e.g. {key}: {{...}}) or null, got {value!r}")
    return value


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """YAML values, then whole-key flags, then dotted flags (`--dataset.path`)."""
    merged = {**base, **{k: v for k, v in overrides.items() if not k.endswith(".")}}
    for key in DICT_FIELDS:
        if key in merged:
            merged[key] = _as_mapping(key, merged[key])
    for key, pairs in overrides.items():
        if key.endswith("."):
            top = key[:-1]
            merged[top] = {**(merged.get(top) or {}), **dict(pairs)}
    if isinstance(merged.get("reward_funcs"), (str, dict)):
        merged["reward_funcs"] = [merged["reward_funcs"]]
    for key in ("reward_funcs", "tools"):  # `--tools '[python, my.py:f]'` as in YAML
        if isinstance(merged.get(key), list):
            merged[key] = [i for x in merged[key] for i in _yaml_list(key, x)]
    if "reward_funcs" in merged:
        merged["reward_funcs"] = [_reward_item(x) for x in merged["reward_funcs"]]
    return merged


def _yaml_list(key: str, item: Any) -> list[Any]:
    """A flag's list item written as a YAML list (`'[a, b]'`): its entries; anything else as is."""
    if not (isinstance(item, str) and item.lstrip().startswith("[")):
        return [item]
    try:
        value = safe_load(item, key)
    except YAMLTooLarge as err:
        raise RecipeError(str(err)) from err
    except yaml.YAMLError as err:
        raise RecipeError(f"{key}: cannot parse {item!r} as a list: {one_line(err)}") from err
    return value if isinstance(value, list) else [value]


def _reward_item(item: Any) -> Any:
    if isinstance(item, str) and item.lstrip().startswith("{"):
        try:
            return safe_load(item, "reward_funcs")
        except YAMLTooLarge as err:
            raise RecipeError(str(err)) from err
        except yaml.YAMLError as err:
            raise RecipeError(
                f"reward_funcs entry {item!r} is not valid YAML ({one_line(err)}); write it as "
                "'{name: NAME, params: {key: value}}'"
            ) from err
    return item


def build_recipe(raw: dict[str, Any], source: str | None = None) -> Recipe:
    """`parse_dict` over the merged dict; unknown keys and config contradictions -> RecipeError."""
    known = recipe_keys()
    for key in raw:
        if key not in known:
            raise RecipeError(unknown_key_message(key, known))
    try:  # "1e-3" -> 0.001 for a float field; `beta: yes` refused (one line naming the field)
        fields = field_types(RecipeArguments, GRPOConfig)
        raw = coerce_values(raw, fields, skip=("reward_funcs", *DICT_FIELDS))
    except ValueError as err:
        raise RecipeError(one_line(err)) from err
    try:  # the progress lines are on unless the recipe turns them off (disable_tqdm: true);
        # transformers' default follows its log level, which the CLI sets to errors only.
        # A recipe's run takes the free cores (torch_threads: auto) unless it says otherwise.
        defaults = {"disable_tqdm": False, "torch_threads": "auto"}
        args, config = recipe_parser().parse_dict({**defaults, **raw}, allow_extra_keys=False)
    except (ValueError, TypeError) as err:
        raise RecipeError(one_line(err)) from err
    if args.dataset is None:
        raise RecipeError("the recipe has no `dataset`; add e.g. `dataset: {name: arithmetic}`")
    return Recipe(args, config, raw, source)


def load_recipe(path: str | Path | None, flags: Sequence[str] = ()) -> Recipe:
    """Read a recipe YAML (or none: all defaults), apply the command-line flags, build it.

    A built-in recipe's name (`tool_use`) becomes its file's path: the files it names (tools,
    rewards, eval_metrics) are looked up next to the file, not in the working directory."""
    if path is not None:
        try:
            path = find_recipe(path)
        except OSError as err:  # not found, or a folder
            raise RecipeError(one_line(err)) from err
    base = read_yaml(path) if path is not None else {}
    raw = merge(base, parse_overrides(flags))
    return build_recipe(raw, str(path) if path is not None else None)
