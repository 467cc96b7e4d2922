"""What is checked before an evaluating run loads a model: the eval sets, the `eval_metrics` hook,
the schedule, and the metric that picks the best model.

Every problem is a `ValueError` whose message is one line saying how to fix it; the trainer raises
it before loading the model and `grpo-plugin train` turns it into exit code 2.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..user_code.callables import load_callable

EvalMetricsFn = Callable[..., dict[str, float]]
# What every evaluation logs, before the `eval_` (or `eval_<name>_`) prefix; see eval_loop.py.
BUILTIN_KEYS = (
    "accuracy",
    "n",
    "loss",
    "policy_loss",
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "completions/clipped_ratio",
    "completions/mean_terminated_length",
    "completions/min_terminated_length",
    "completions/max_terminated_length",
    "entropy",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_max",
    "num_tokens",
    "tools/call_frequency",
    "tools/call_rate",
    "runtime",
    "samples_per_second",
    "steps_per_second",
)


# ----------------------------------------------------------------------------- the hook


def resolve_eval_metrics(
    spec: EvalMetricsFn | str | None, base_dir: str | Path | None = None
) -> EvalMetricsFn | None:
    """A callable, or `"package.module:function"`, or `"path/to/file.py:function"` (relative to
    `base_dir`, else the working directory)."""
    if spec is None or callable(spec):
        return spec
    return load_callable(spec, "eval_metrics", base_dir)


def check_metrics_result(result: Any, fn: EvalMetricsFn) -> dict[str, float]:
    """The hook must return `{name: number}` with names that do not shadow the built-in keys."""
    name = getattr(fn, "__name__", type(fn).__name__)
    if not isinstance(result, dict):
        raise TypeError(
            f"eval_metrics function {name!r} returned {type(result).__name__}; "
            "return a dict of metric name -> number"
        )
    out = {}
    for key, value in result.items():
        if not isinstance(key, str) or key in BUILTIN_KEYS or key.startswith("pass@"):
            raise ValueError(
                f"eval_metrics function {name!r} returned the metric name {key!r}, which is not a "
                "string or is already logged by grpo-plugin; rename it"
            )
        try:
            out[key] = float(value)
        except (TypeError, ValueError) as err:
            raise TypeError(
                f"eval_metrics function {name!r} returned {value!r} for {key!r}; expected a number"
            ) from err
    return out


# ----------------------------------------------------------------------------- the options

# `evaluate`'s options: (kind, least value or None, what to write instead)
EVAL_OPTIONS = {
    "k": ("int", 0, "pass@k's k, e.g. 8; 0 turns pass@k off"),
    "num_samples": ("int", 1, "samples per prompt for pass@k, >= k"),
    "max_new_tokens": ("int", 1, "new tokens per completion, e.g. 256"),
    "batch_size": ("int", 1, "sequences generated at once, e.g. 32"),
    "temperature": ("float", 0, "the sampling temperature of pass@k, e.g. 1.0"),
    "success_threshold": ("float", None, "the first reward a correct completion reaches, e.g. 1.0"),
    "seed": ("int", None, "it keys the samples, e.g. 0"),
}


def _fits(value: Any, kind: str, least: float | None) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if kind == "int" and not isinstance(value, int):
        return False
    return math.isfinite(value) and (least is None or value >= least)


def check_eval_options(options: dict[str, Any], name: Callable[[str], str] = str) -> None:
    """`evaluate`'s options (None: the default) before anything is generated: one line naming
    the option as the user wrote it (`name`: e.g. "eval.k" in a recipe, "--k" on the command
    line). `--k -3` failed in the middle of the evaluation as a negative tensor dimension."""
    for key, value in options.items():
        if key not in EVAL_OPTIONS or value is None:
            continue
        kind, least, what = EVAL_OPTIONS[key]
        if not _fits(value, kind, least):
            word = "an integer" if kind == "int" else "a finite number"
            bound = f" >= {least}" if least is not None else ""
            raise ValueError(f"{name(key)}={value!r} must be {word}{bound}: {what}.")
    k, samples = options.get("k"), options.get("num_samples")
    if k and samples is not None and samples < k:
        raise ValueError(
            f"{name('num_samples')}={samples} must be >= {name('k')}={k}: pass@k draws k of them."
        )


# ----------------------------------------------------------------------------- the eval sets


def _check_one(dataset: Any, label: str) -> Any:
    from datasets import Dataset, IterableDataset

    if isinstance(dataset, list):
        dataset = Dataset.from_list(dataset)
    if isinstance(dataset, IterableDataset):
        columns = dataset.column_names  # None when the features are not known up front
    else:
        columns = getattr(dataset, "column_names", None)
        if columns is None:
            raise TypeError(
                f"{label} is a {type(dataset).__name__}; pass a datasets.Dataset, an "
                "IterableDataset, a list of dicts or a dict of those"
            )
        if len(dataset) == 0:
            raise ValueError(f"{label} is empty; give it at least one held-out prompt")
    if columns is not None and "prompt" not in columns:
        raise ValueError(
            f"{label} has no 'prompt' column (columns: {columns}). Rename the column holding the "
            "prompt, e.g. dataset.rename_column('question', 'prompt')."
        )
    return dataset


def check_eval_datasets(eval_dataset: Any) -> Any:
    """A Dataset, IterableDataset or list of dicts, or a dict `{name: one of those}` (each
    evaluated under the prefix `eval_<name>_`); None stays None."""
    if eval_dataset is None:
        return None
    if isinstance(eval_dataset, dict):
        if not eval_dataset:
            raise ValueError("eval_dataset is an empty dict; give at least one named dataset")
        return {
            str(name): _check_one(ds, f"eval_dataset[{name!r}]")
            for name, ds in eval_dataset.items()
        }
    return _check_one(eval_dataset, "eval_dataset")


def eval_set_names(eval_dataset: Any) -> list[str] | None:
    """None: no eval set; `[""]`: one; the names of a dict of eval sets."""
    if eval_dataset is None:
        return None
    return list(eval_dataset) if isinstance(eval_dataset, dict) else [""]


# ----------------------------------------------------------------------------- the schedule


def prefixed(key: str, set_name: str = "", prefix: str = "eval") -> str:
    return f"{prefix}_{set_name}_{key}" if set_name else f"{prefix}_{key}"


def logged_eval_keys(args: Any, reward_names: Sequence[str], set_names: Sequence[str]) -> set[str]:
    """Every key an evaluation logs (the hook's keys aside)."""
    keys = list(BUILTIN_KEYS) + [f"rewards/{r}/{s}" for r in reward_names for s in ("mean", "std")]
    if args.beta > 0:
        keys.append("kl")
    k = args.num_generations_eval or args.num_generations
    if k == 1 and args.beta == 0:
        keys.remove("entropy")  # eval_loop skips the forward pass then
    if k > 1:
        keys.append(f"pass@{k}")
    return {prefixed(key, name) for name in set_names for key in keys}


def best_metric_key(metric: str) -> str:
    """`metric_for_best_model` as the Trainer reads it: `eval_` is prepended when missing."""
    return metric if metric.startswith("eval_") else f"eval_{metric}"


def check_eval_setup(
    args: Any, set_names: Sequence[str] | None, reward_names: Sequence[str], has_hook: bool
) -> None:
    """Raise one line when the evaluation schedule cannot work (before any model loads)."""
    strategy = str(getattr(args.eval_strategy, "value", args.eval_strategy))
    scheduled = strategy != "no" or args.eval_on_start
    if scheduled and set_names is None:
        what = f"eval_strategy={strategy!r}" if strategy != "no" else "eval_on_start"
        raise ValueError(
            f"{what} evaluates on a held-out set, but there is none: pass eval_dataset (recipes: "
            "dataset eval_size or eval_path) or set eval_strategy to 'no'"
        )
    if not scheduled or args.metric_for_best_model is None:
        return
    metric = best_metric_key(args.metric_for_best_model)
    keys = logged_eval_keys(args, reward_names, set_names)
    if metric not in keys and not has_hook:
        names = sorted(k for k in keys if k.endswith(("_accuracy", "_loss", "_reward")) or "@" in k)
        raise ValueError(
            f"metric_for_best_model={args.metric_for_best_model!r} is never logged (as {metric!r});"
            f" use a key the evaluation logs, e.g. {', '.join(names)}"
        )
