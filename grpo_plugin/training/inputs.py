"""What the trainer is given, checked before anything is loaded. Each check raises ValueError
with one line that says how to fix it; the recipe checker (`app/preflight`, so `--dry-run` sees
them) and `GRPOTrainer` (for Python users) both run them.

- `check_output_dir`: not a file, writable, with room for checkpoints (`needed_free_mb`: twice
  the newest checkpoint's size plus a margin, `MIN_FREE_MB` before the first).
- `check_prompts`: every prompt a non-empty string or a non-empty list of chat messages, the bad
  row named by its index.
- `check_prompt_lengths` (needs the tokenizer): prompts that do not fit the model's context with
  `max_completion_length` new tokens are an error, unless `max_prompt_length` truncates them,
  which is logged as a warning with how many and the longest.
- `check_train_size`: the training set holds one rollout's prompts on every process.
- `check_inputs`: what `GRPOTrainer.__init__` runs (datasets, model source, output_dir, launch).

Checked once. A recipe's datasets are checked by the recipe checker and then handed, as the same
objects, to `GRPOTrainer`. Verdicts and token lengths are remembered per `datasets.Dataset`
object (`_Seen`, weakly, so a dropped dataset frees them): the second check of the same prompts
neither walks nor tokenizes them again. Datasets are immutable, so the memo cannot go stale; the
token lengths are keyed by the tokenizer (name, chat template, vocabulary size) and the chat
template arguments, as they depend on those.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..distributed import check_launch
from ..evaluation.setup import check_eval_datasets
from ..models import model_source
from ..rollout.prompts import encode_prompts, prompt_problem
from ..run import checkpoints
from .sampling.streaming import (
    apply_stream_settings,
    check_streamed_training,
    is_streamed,
    stream_columns,
)

logger = logging.getLogger(__name__)

MIN_FREE_MB = 256  # no checkpoint yet: a LoRA checkpoint of a small model, metrics, completions
CHECKPOINT_MARGIN_MB = 32  # beside two checkpoints: metrics.jsonl, the completion tables, eval.json
LENGTH_SAMPLE = 20_000  # prompts tokenized by `check_prompt_lengths` (the first ones)


# --- output_dir ----------------------------------------------------------------------------------
def _existing_ancestor(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_output_dir(output_dir: str | os.PathLike) -> None:
    if not str(output_dir).strip():
        raise ValueError("output_dir is empty; give the folder the run writes to.")
    path = Path(output_dir).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(
            f"output_dir {path} is a file, not a directory; choose another output_dir."
        )
    base = _existing_ancestor(path.absolute())
    if not base.is_dir():
        raise ValueError(f"output_dir {path} cannot be created: {base} is a file.")
    try:
        tempfile.TemporaryFile(dir=base).close()
    except OSError as err:
        raise ValueError(
            f"output_dir {path} is not writable ({err.strerror} in {base}); choose a writable "
            "output_dir."
        ) from None
    free_mb = shutil.disk_usage(base).free / 2**20
    need_mb, why = needed_free_mb(path)
    if free_mb < need_mb:
        raise ValueError(
            f"output_dir {path} is on a nearly full device ({free_mb:.0f} MB free, {need_mb:.0f} "
            f"MB needed: {why}); free some space or choose another output_dir."
        )


def _folder_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20


def needed_free_mb(output_dir: str | os.PathLike) -> tuple[float, str]:
    """The free space a run into `output_dir` needs, and why (for the message): twice its
    newest checkpoint (the next one is written before the oldest is rotated out) plus
    `CHECKPOINT_MARGIN_MB`; `MIN_FREE_MB` when it has none yet (a fresh run, size unknown)."""
    found = checkpoints.checkpoints(output_dir)
    if not found:
        return float(MIN_FREE_MB), "an estimate for the first checkpoints"
    size = _folder_mb(found[-1])
    return 2 * size + CHECKPOINT_MARGIN_MB, (
        f"2 x {size:.0f} MB for {found[-1].name} and the next checkpoint, "
        f"+ {CHECKPOINT_MARGIN_MB} MB for metrics and completions"
    )


# --- prompts, checked once -----------------------------------------------------------------------
@dataclass
class _Seen:
    """What is known of one dataset object's prompts."""

    usable: bool = False  # check_prompts passed
    lengths: dict[str, list[int]] = field(default_factory=dict)  # tokenizer key -> token counts
    length_checks: set[tuple] = field(default_factory=set)  # check_prompt_lengths calls passed


_SEEN: weakref.WeakKeyDictionary[Any, _Seen] = weakref.WeakKeyDictionary()


def _seen(data: Any) -> _Seen | None:
    """The memo of a `datasets.Dataset` (None for a list or a column: those are not memoized)."""
    from datasets import Dataset

    if not isinstance(data, Dataset):
        return None
    return _SEEN.setdefault(data, _Seen())


def _prompts_of(data: Any) -> Sequence[Any]:
    return data["prompt"] if hasattr(data, "column_names") else data


def check_prompts(data: Any, name: str) -> None:
    """Every prompt of `data` (a Dataset with a `prompt` column, or a list of prompts) usable;
    the first bad one named by its row index."""
    seen = _seen(data)
    if seen is not None and seen.usable:
        return
    for i, prompt in enumerate(_prompts_of(data)):
        problem = prompt_problem(prompt)
        if problem is not None:
            raise ValueError(f"{name} row {i}: the prompt {problem}; fix or drop that row.")
    if seen is not None:
        seen.usable = True


def _tokenizer_key(tokenizer: Any, chat_template_kwargs: dict | None) -> str:
    template = getattr(tokenizer, "chat_template", None)
    parts = [getattr(tokenizer, "name_or_path", ""), template, len(tokenizer), chat_template_kwargs]
    return json.dumps(parts, sort_keys=True, default=repr)


def prompt_lengths(data: Any, tokenizer: Any, chat_template_kwargs: dict | None) -> list[int]:
    """Token counts of the first `LENGTH_SAMPLE` prompts, as the rollout encodes them (before
    `max_prompt_length`); tokenized once per dataset object and tokenizer."""
    seen = _seen(data)
    key = _tokenizer_key(tokenizer, chat_template_kwargs)
    if seen is not None and key in seen.lengths:
        return seen.lengths[key]
    sample = list(_prompts_of(data)[:LENGTH_SAMPLE])
    encoded = encode_prompts(tokenizer, sample, chat_template_kwargs=chat_template_kwargs)
    lengths = [len(ids) for ids in encoded]
    if seen is not None:
        seen.lengths[key] = lengths
    return lengths


def context_length(config: Any, tokenizer: Any) -> int | None:
    """The model's context in tokens: its config's, else the tokenizer's (when plausible)."""
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    value = getattr(tokenizer, "model_max_length", None)
    return value if isinstance(value, int) and 0 < value < 10**7 else None


def _check_budget(context: int, args: Any) -> int:
    """The tokens a prompt may take beside `max_completion_length`; refuses settings that cannot
    fit the context at all."""
    budget = context - args.max_completion_length
    if budget < 1:
        raise ValueError(
            f"max_completion_length={args.max_completion_length} leaves no room for a prompt in "
            f"the model's context of {context} tokens; lower it."
        )
    limit = args.max_prompt_length
    if limit is not None and limit > budget:
        raise ValueError(
            f"max_prompt_length={limit} + max_completion_length={args.max_completion_length} "
            f"exceed the model's context of {context} tokens; lower one of them."
        )
    return budget


def check_prompt_lengths(data: Any, tokenizer: Any, config: Any, args: Any, name: str) -> None:
    """Prompts that do not fit `context - max_completion_length`: an error, or (with
    `max_prompt_length`) a warning that they are cut from the left."""
    context = context_length(config, tokenizer)
    if context is None or len(data) == 0:
        return
    budget = _check_budget(context, args)
    limit, kwargs = args.max_prompt_length, args.chat_template_kwargs
    seen = _seen(data)
    check = (_tokenizer_key(tokenizer, kwargs), context, args.max_completion_length, limit)
    if seen is not None and check in seen.length_checks:
        return  # this dataset passed this very check (and warned, if it had to) already
    lengths = prompt_lengths(data, tokenizer, kwargs)
    over = [n for n in lengths if n > (limit if limit is not None else budget)]
    what = f"{len(over)} of {len(lengths)} prompts in {name} are longer than"
    if over and limit is None:
        raise ValueError(
            f"{what} the {budget} tokens the model's context ({context}) leaves beside "
            f"max_completion_length={args.max_completion_length} (longest: {max(over)} tokens); "
            "set max_prompt_length to cut them from the left, or shorten them."
        )
    if over:
        logger.warning(
            "%s max_prompt_length=%d tokens (longest: %d); their first tokens are cut off.",
            what,
            limit,
            max(over),
        )
    if seen is not None:
        seen.length_checks.add(check)


# --- the trainer's inputs ------------------------------------------------------------------------
def check_prompt_dataset(dataset: Any, name: str, prompt_required: bool = True) -> Any:
    """Accept a datasets.Dataset, an IterableDataset or a list of dicts; require a `prompt`
    column unless not `prompt_required` (the train set: with an environment_factory each
    `reset()` may supply the prompt, as in TRL; `ToolInputs.check_dataset` refuses a set
    without one when there is no environment_factory)."""
    if dataset is None:
        return None
    if isinstance(dataset, list):
        from datasets import Dataset

        dataset = Dataset.from_list(dataset)
    columns = getattr(dataset, "column_names", None) or []
    if not columns and is_streamed(dataset):
        columns = stream_columns(dataset)
    if "prompt" not in columns and not prompt_required:
        return dataset  # the environments own the prompts (checked by ToolInputs.check_dataset)
    if "prompt" not in columns:
        raise ValueError(
            f"{name} has no 'prompt' column (columns: {columns}). Rename the column holding the "
            "prompt text or chat messages, e.g. dataset.rename_column('question', 'prompt')."
        )
    if not is_streamed(dataset):  # a stream's prompts are checked as they are sampled
        check_prompts(dataset, name)
    return dataset


def check_train_size(dataset: Any, args: Any) -> None:
    """A training set (not a stream) holds one rollout's prompts on every process; the prompt
    sampler refused it only once the model had loaded."""
    if dataset is None or is_streamed(dataset) or "prompt" not in dataset.column_names:
        return  # a stream is checked as it is read; without prompts ToolInputs checks the set
    need = args.prompts_per_generation * args.world_size
    if len(dataset) < need:
        on = f" on {args.world_size} processes" if args.world_size > 1 else ""
        raise ValueError(
            f"the training data has {len(dataset)} prompts but one rollout{on} needs {need} "
            f"(per_device_train_batch_size {args.per_device_train_batch_size} x "
            f"steps_per_generation {args.steps_per_generation} / num_generations "
            f"{args.num_generations}); add prompts or lower per_device_train_batch_size."
        )


def check_inputs(model: Any, args: Any, train_dataset: Any, eval_dataset: Any) -> tuple[Any, Any]:
    """`GRPOTrainer`'s cheap checks, before anything loads: the datasets (every prompt usable;
    a train set without a `prompt` column is left to `ToolInputs.check_dataset`, which knows
    whether environments supply the prompts; a stream needs `max_steps`), the model source,
    output_dir. Returns the datasets as the trainer keeps them (lists become `Dataset`s)."""
    train_dataset = check_prompt_dataset(train_dataset, "train_dataset", prompt_required=False)
    eval_dataset = check_eval_datasets(eval_dataset)
    apply_stream_settings(args, train_dataset, eval_dataset)  # dispatch_batches, workers (TRL)
    check_streamed_training(train_dataset, args)
    check_train_size(train_dataset, args)
    model_source.check_model_source(model)
    check_output_dir(args.output_dir)
    check_launch(args)  # ZeRO-3 is refused before the model loads
    return train_dataset, eval_dataset


def check_prompt_lengths_of(dataset: Any, tokenizer: Any, config: Any, args: Any) -> None:
    """The training prompts fit the context (`check_prompt_lengths`); not for streams."""
    if dataset is not None and not is_streamed(dataset) and "prompt" in dataset.column_names:
        check_prompt_lengths(dataset, tokenizer, config, args, "train_dataset")
