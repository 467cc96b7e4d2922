"""Checks that need no model: run before anything loads, by the recipe checker (so `--dry-run`
catches them) and by `GRPOTrainer` for Python users. Each raises ValueError with one line that
says how to fix it.

- `check_output_dir`: not a file, writable, with room for checkpoints (`MIN_FREE_MB`).
- `check_model_source`: an existing local directory, an `embedded:` name, or a valid Hub id that
  is in the local cache when the Hub is offline (`HF_HUB_OFFLINE=1`).
- `check_prompts`: every prompt a non-empty string or a non-empty list of chat messages, the bad
  row named by its index.
- `check_prompt_lengths` (needs the tokenizer): prompts that do not fit the model's context with
  `max_completion_length` new tokens are an error, unless `max_prompt_length` truncates them,
  which is logged as a warning with how many and the longest.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..models import is_embedded
from ..rollout.prompts import encode_prompts, prompt_problem

logger = logging.getLogger(__name__)

MIN_FREE_MB = 256  # a LoRA checkpoint of a small model, the metrics and the completion tables
LENGTH_SAMPLE = 20_000  # prompts tokenized by `check_prompt_lengths` (the first ones)
_OFFLINE = ("1", "ON", "YES", "TRUE")


# --- output_dir ----------------------------------------------------------------------------------
def _existing_ancestor(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_output_dir(output_dir: str | os.PathLike) -> None:
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
    if free_mb < MIN_FREE_MB:
        raise ValueError(
            f"output_dir {path} is on a nearly full device ({free_mb:.0f} MB free, at least "
            f"{MIN_FREE_MB} MB needed for checkpoints); free some space or choose another output_dir."
        )


# --- the model -----------------------------------------------------------------------------------
def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~", ".\\")) or name.count("/") > 1 or "\\" in name


def check_model_source(name: Any) -> None:
    """A model given by name must be loadable without guessing: see the module docstring."""
    if not isinstance(name, (str, os.PathLike)) or is_embedded(str(name)):
        return  # a loaded model, or an embedded name (checked when it is resolved)
    name = str(name)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"model directory {name} has no config.json; is it a model folder?")
        return
    if path.exists() or _looks_like_path(name):
        raise ValueError(f"model path {name} does not exist; fix the path (or give a Hub id).")
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        raise ValueError(
            f"model {name!r} is neither a local directory nor a valid Hub id ('org/name')."
        ) from None
    if os.environ.get("HF_HUB_OFFLINE", "").upper() in _OFFLINE and not _in_hub_cache(name):
        raise ValueError(
            f"model {name!r} is not a local directory and not in the Hugging Face cache, and the "
            "Hub is offline (HF_HUB_OFFLINE=1); download it first or give a local directory."
        )


def _in_hub_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


# --- prompts -------------------------------------------------------------------------------------
def check_prompts(prompts: Sequence[Any], name: str) -> None:
    """Every prompt usable; the first bad one named by its row index."""
    for i, prompt in enumerate(prompts):
        problem = prompt_problem(prompt)
        if problem is not None:
            raise ValueError(f"{name} row {i}: the prompt {problem}; fix or drop that row.")


def context_length(config: Any, tokenizer: Any) -> int | None:
    """The model's context in tokens: its config's, else the tokenizer's (when plausible)."""
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    value = getattr(tokenizer, "model_max_length", None)
    return value if isinstance(value, int) and 0 < value < 10**7 else None


def check_prompt_lengths(
    prompts: Sequence[Any], tokenizer: Any, config: Any, args: Any, name: str
) -> None:
    """Prompts that do not fit `context - max_completion_length`: an error, or (with
    `max_prompt_length`) a warning that they are cut from the left."""
    context = context_length(config, tokenizer)
    if context is None or not prompts:
        return
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
    sample = list(prompts[:LENGTH_SAMPLE])
    encoded = encode_prompts(tokenizer, sample, chat_template_kwargs=args.chat_template_kwargs)
    lengths = [len(ids) for ids in encoded]
    cap = limit if limit is not None else budget
    over = [n for n in lengths if n > cap]
    if not over:
        return
    what = f"{len(over)} of {len(sample)} prompts in {name} are longer than"
    if limit is None:
        raise ValueError(
            f"{what} the {budget} tokens the model's context ({context}) leaves beside "
            f"max_completion_length={args.max_completion_length} (longest: {max(over)} tokens); "
            "set max_prompt_length to cut them from the left, or shorten them."
        )
    logger.warning(
        "%s max_prompt_length=%d tokens (longest: %d); their first tokens are cut off.",
        what,
        limit,
        max(over),
    )
