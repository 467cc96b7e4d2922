"""What the trainer is given, checked before anything is loaded: datasets and reward weights
(reward functions and models: `reward_models.resolve_reward_funcs`)."""

from __future__ import annotations

from typing import Any

import torch

from . import preflight
from .distributed import check_launch
from .evaluation.setup import check_eval_datasets
from .sampling.streaming import check_streamed_training, is_streamed, stream_columns


def check_prompt_dataset(dataset: Any, name: str) -> Any:
    """Accept a datasets.Dataset, an IterableDataset or a list of dicts; require a `prompt`
    column."""
    if dataset is None:
        return None
    if isinstance(dataset, list):
        from datasets import Dataset

        dataset = Dataset.from_list(dataset)
    columns = getattr(dataset, "column_names", None) or []
    if not columns and is_streamed(dataset):
        columns = stream_columns(dataset)
    if "prompt" not in columns:
        raise ValueError(
            f"{name} has no 'prompt' column (columns: {columns}). Rename the column holding the "
            "prompt text or chat messages, e.g. dataset.rename_column('question', 'prompt')."
        )
    if not is_streamed(dataset):  # a stream's prompts are checked as they are sampled
        preflight.check_prompts(dataset["prompt"], name)
    return dataset


def check_inputs(model: Any, args: Any, train_dataset: Any, eval_dataset: Any) -> tuple[Any, Any]:
    """`GRPOTrainer`'s cheap checks, before anything loads: the datasets (a `prompt` column,
    every prompt usable; a stream needs `max_steps`), the model source, output_dir. Returns the
    datasets as the trainer keeps them (lists become `Dataset`s)."""
    train_dataset = check_prompt_dataset(train_dataset, "train_dataset")
    check_streamed_training(train_dataset, args)
    eval_dataset = check_eval_datasets(eval_dataset)
    preflight.check_model_source(model)
    preflight.check_output_dir(args.output_dir)
    check_launch(args)  # ZeRO-3 is refused before the model loads
    return train_dataset, eval_dataset


def check_prompt_lengths_of(dataset: Any, tokenizer: Any, config: Any, args: Any) -> None:
    """The training prompts fit the context (`preflight.check_prompt_lengths`); not for streams."""
    if dataset is not None and not is_streamed(dataset):
        preflight.check_prompt_lengths(dataset["prompt"], tokenizer, config, args, "train_dataset")


def reward_weight_tensor(weights: list[float] | None, num_funcs: int) -> torch.Tensor:
    weights = weights or [1.0] * num_funcs
    if len(weights) != num_funcs:
        raise ValueError(
            f"reward_weights has {len(weights)} entries for {num_funcs} reward functions; "
            "give one weight per function."
        )
    return torch.tensor(weights, dtype=torch.float32)
