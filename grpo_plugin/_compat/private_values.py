"""Values a library keeps under a private name and offers no public way to read or set (the rows
`training_args_dict_fields` and `set_scheduler_last_lr` of the table in `__init__.py`)."""

from __future__ import annotations

from typing import Any


def training_args_dict_fields() -> list[str]:
    """The `TrainingArguments` fields whose JSON strings (`'{...}'`) transformers turns into dicts
    in `__post_init__`: its private `_VALID_DICT_FIELDS`, which a subclass extends with its own
    (and, before transformers 5.23, `activation_checkpointing_kwargs`: `checkpointing.py`)."""
    from transformers import TrainingArguments

    from .checkpointing import activation_checkpointing_dict_fields

    return list(TrainingArguments._VALID_DICT_FIELDS) + activation_checkpointing_dict_fields()


def set_scheduler_last_lr(scheduler: Any, lrs: list[float]) -> None:
    """Make `scheduler.get_last_lr()` return `lrs`, the rates just set on the optimizer's groups.

    torch 2.13's `LRScheduler` stores what `get_last_lr()` returns in `_last_lr` and sets it only
    in `step()`, which would also count a step (and may warn that it came before
    `optimizer.step()`); a schedule evaluated again at a restored step sets it directly.
    """
    scheduler._last_lr = list(lrs)
