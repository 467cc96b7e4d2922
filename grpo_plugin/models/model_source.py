"""Which model (or adapter) a name means, checked before anything loads: each problem raises
ValueError with one line that says how to fix it.

- `check_model_source`: an existing local directory with its config and whole weight files
  (`weight_files.py`), a known `embedded:` name, or a valid Hub id that is in the local cache
  when the Hub is offline (`HF_HUB_OFFLINE=1`) or cannot be reached (`hub_access.py`).
- `check_adapter_dir`: a LoRA adapter directory with its `adapter_config.json` and whole weights.

`GRPOTrainer`, the recipe checker, `grpo-plugin eval` and publishing (a base model that moved) all
ask it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from . import hub_access, weight_files
from .embedded import check_embedded_name, is_embedded

logger = logging.getLogger(__name__)


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~", ".\\")) or name.count("/") > 1 or "\\" in name


def check_model_source(name: Any) -> None:
    """A model given by name must be loadable without guessing: see the module docstring."""
    if not isinstance(name, (str, os.PathLike)):
        return  # a loaded model
    name = str(name)
    if is_embedded(name):
        check_embedded_name(name)  # a known name; the package that ships it is checked on use
        return
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"model directory {name} has no config.json; is it a model folder?")
        weight_files.check_model_weights(path)  # present and whole: no traceback in the load
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
    unreachable = hub_access.unreachable_reason()
    if unreachable and not _in_hub_cache(name):
        raise ValueError(
            f"model {name!r} is not a local directory and not in the Hugging Face cache, and "
            f"{unreachable}; download it first or give a local directory."
        )
    if unreachable and not hub_access.offline():  # cached: it loads, after minutes of retries
        logger.warning(
            "%s, so model %r loads from the Hugging Face cache after retrying the Hub for about "
            "a minute per file; set HF_HUB_OFFLINE=1 to skip the retries.",
            unreachable[0].upper() + unreachable[1:],
            name,
        )


def check_adapter_dir(adapter: str | os.PathLike) -> None:
    """A LoRA adapter given by path: an existing directory holding `adapter_config.json`."""
    path = Path(adapter).expanduser()
    if not path.is_dir():
        raise ValueError(
            f"adapter {adapter} is not a directory; pass a run's output_dir or a checkpoint-N dir."
        )
    if not (path / "adapter_config.json").is_file():
        raise ValueError(
            f"adapter {adapter} has no adapter_config.json (not a LoRA adapter; a full fine-tune "
            "is a model: pass it as --model)."
        )
    weight_files.check_adapter_weights(path)


def _in_hub_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
