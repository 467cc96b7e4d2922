"""A recipe's data in three splits: train, validation and test.

    train       what GRPO samples prompts from
    validation  what the evaluations during training run on: the curve, the best step,
                `load_best_model_at_end`'s choice (dataset `validation_size: N`)
    test        the held-out set (`eval_size` / `eval_path`): the numbers a run reports,
                before and after training, never used to choose anything

Without `validation_size` there are two splits, as before: the evaluations during training run
on the held-out set, so a best step picked there is picked on the data it is reported on (the
recipe checks refuse `load_best_model_at_end` in that case).

Where the validation rows come from:
- arithmetic: N more distinct pairs, drawn after the train and test pairs, so the train and test
  sets of a seed are the same with or without a validation split;
- code: N prompts of the validation templates, exercises that neither training nor the test
  set holds (`code_tasks.py`), drawn with their own seeded rng, so train and test do not change;
- any other dataset: the training data's last N rows (before `train_size` is applied), kept out
  of training.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from datasets import Dataset

from .code_tasks import code_splits
from .data import load_prompt_datasets, validate_dataset_spec

ARITHMETIC_TEST_SIZE = 64  # arithmetic's default eval_size (data.load_prompt_datasets)


@dataclass
class PromptSplits:
    """The datasets of a recipe; `test` and `validation` are None when the recipe has none."""

    train: Dataset
    test: Dataset | None
    validation: Dataset | None = None


def load_splits(spec: dict[str, Any]) -> PromptSplits:
    """The train, test and (with `validation_size`) validation sets of a dataset spec."""
    n_validation = spec.get("validation_size", 0)
    if not n_validation:
        return PromptSplits(*load_prompt_datasets(spec))
    if spec.get("name") == "arithmetic":
        return _arithmetic_splits(spec, n_validation)
    if spec.get("name") == "code":
        validate_dataset_spec(spec)
        return PromptSplits(*code_splits(spec, n_validation))
    return _tail_splits(spec, n_validation)


def _arithmetic_splits(spec: dict[str, Any], n_validation: int) -> PromptSplits:
    n_test = spec.get("eval_size", ARITHMETIC_TEST_SIZE)
    train, held_out = load_prompt_datasets({**spec, "eval_size": n_test + n_validation})
    assert held_out is not None  # n_validation > 0 rows were asked for
    test = held_out.select(range(n_test)) if n_test else None
    return PromptSplits(train, test, held_out.select(range(n_test, n_test + n_validation)))


def _tail_splits(spec: dict[str, Any], n_validation: int) -> PromptSplits:
    full, test = load_prompt_datasets({k: v for k, v in spec.items() if k != "train_size"})
    if n_validation >= len(full):
        raise ValueError(
            f"dataset: validation_size {n_validation} leaves no training rows (the training data "
            f"has {len(full)}); lower validation_size"
        )
    rest = len(full) - n_validation
    train = full.select(range(rest))
    if spec.get("train_size") is not None:
        train = train.select(range(min(spec["train_size"], rest)))
    return PromptSplits(train, test, full.select(range(rest, len(full))))
