"""What the trainer is given, checked before anything is loaded: datasets and reward weights
(reward functions and models: `reward_models.resolve_reward_funcs`)."""

from __future__ import annotations

from typing import Any

import torch

from .streaming import is_streamed, stream_columns


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
    return dataset


def reward_weight_tensor(weights: list[float] | None, num_funcs: int) -> torch.Tensor:
    weights = weights or [1.0] * num_funcs
    if len(weights) != num_funcs:
        raise ValueError(
            f"reward_weights has {len(weights)} entries for {num_funcs} reward functions; "
            "give one weight per function."
        )
    return torch.tensor(weights, dtype=torch.float32)
