"""Evaluations whose result is already known: the evaluation before training, kept on disk.

A recipe's evaluation before training scores the untrained model on a fixed split, so a second
run of the same model, split and settings (another seed, a changed learning rate, a rerun into a
new folder) would compute the same numbers again: minutes, for pass@k of long completions. Here
that result is stored under the plugin's cache (`$GRPO_PLUGIN_CACHE/evaluations`, else
`~/.cache/grpo-plugin/evaluations`; `$GRPO_PLUGIN_EVAL_CACHE` names another folder, or `off`)
under a key that holds everything the numbers depend on:

- the weights, hashed tensor by tensor (the base model's; a LoRA adapter whose every `lora_B` is
  zero adds exactly nothing to any output, so its seed-dependent `lora_A` is left out, and any
  other adapter is hashed in full);
- the model's config and generation config, the tokenizer (its vocabulary and chat template);
- every row of the split, the reward (a verifier of reward_fns or grpo_plugin, and its bound
  parameters) and the evaluation settings;
- where it runs: the source of grpo_plugin and reward_fns, the versions of torch, transformers
  and peft, the CPU (results are bit-exact on one machine, not across CPUs) or GPU, the thread
  count, the reward checks (`reward_timeout`).

What the key cannot see is not cached: a reward of the user's own (it may read modules or files
that change), tools (their code lives outside the package), several processes, weights on the
`meta` device. A corrupt or unreadable entry is recomputed. `eval: {cache: false}` in a recipe turns this off.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import platform
from collections.abc import Callable
from dataclasses import asdict
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import torch

from ..models.embedded import cache_dir

logger = logging.getLogger(__name__)

SUBDIR = "evaluations"
ENV = "GRPO_PLUGIN_EVAL_CACHE"
_PACKAGES = ("grpo_plugin", "reward_fns")


def weights_fingerprint(model: torch.nn.Module) -> str | None:
    """A digest of every parameter and buffer (name, dtype, shape, bytes); a LoRA adapter that
    is exactly the identity (every `lora_B` zero, no other LoRA tensors) is left out. None when
    a tensor has no data here (the meta device)."""
    named = list(model.named_parameters()) + list(model.named_buffers())
    skip_adapter = _identity_adapter(named)
    digest = hashlib.sha256()
    for name, tensor in named:
        if skip_adapter and "lora_" in name:
            continue
        if tensor.device.type == "meta":
            return None
        data = tensor.detach().contiguous().cpu()
        digest.update(f"{name}|{data.dtype}|{tuple(data.shape)}|".encode())
        digest.update(data.view(-1).view(torch.uint8).numpy() if data.numel() else b"")
    return digest.hexdigest()


def _identity_adapter(named: list[tuple[str, torch.Tensor]]) -> bool:
    """Whether the LoRA tensors (if any) add exactly zero to every output: every `lora_B` zero
    and no LoRA tensor but A and B (DoRA's magnitude, for one, changes the output)."""
    lora = [(name, t) for name, t in named if "lora_" in name]
    if not lora:
        return False
    kinds_ok = all(".lora_A." in name or ".lora_B." in name for name, _ in lora)
    return kinds_ok and all(not t.any() for name, t in lora if ".lora_B." in name)


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A digest of the .py sources of grpo_plugin and reward_fns, as imported."""
    import importlib

    digest = hashlib.sha256()
    for name in _PACKAGES:
        root = Path(importlib.import_module(name).__file__).parent
        for path in sorted(root.rglob("*.py")):
            source = hashlib.sha256(path.read_bytes()).hexdigest()
            digest.update(f"{path.relative_to(root)}|{source}|".encode())
    return digest.hexdigest()


def reward_identity(reward_fn: Callable) -> dict[str, Any] | None:
    """The reward's module, name and bound parameters (a functools.partial's), for a reward of
    reward_fns or grpo_plugin (their source is in `code_fingerprint`); None for any other: a
    user's reward may read modules or files that the key cannot see."""
    fn, bound = reward_fn, {}
    while isinstance(fn, partial):
        bound = {**fn.keywords, **bound}
        fn = fn.func
    module = getattr(fn, "__module__", None) or ""
    closure = getattr(fn, "__closure__", None)
    if module.split(".")[0] not in _PACKAGES or closure or not inspect.isfunction(fn):
        return None
    return {"module": module, "name": fn.__qualname__, "bound": bound}


def tokenizer_identity(tokenizer: Any) -> str:
    """The vocabulary (the fast tokenizer's full JSON where there is one) and chat template."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    vocab = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab())
    parts = [vocab, str(getattr(tokenizer, "chat_template", None)), str(tokenizer.eos_token)]
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


def rows_digest(dataset: Any) -> str:
    digest = hashlib.sha256()
    for row in dataset:
        digest.update(json.dumps(row, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def where_it_runs(model: torch.nn.Module) -> dict[str, Any]:
    import peft
    import transformers

    device = next(model.parameters()).device
    return {
        "code": code_fingerprint(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "device": str(device),
        "machine": torch.cuda.get_device_name() if device.type == "cuda" else _cpu_name(),
        "threads": torch.get_num_threads(),
    }


def _cpu_name() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    lines = [line for line in info.splitlines() if line.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(lines)))


def evaluation_key(
    model: torch.nn.Module,
    tokenizer: Any,
    dataset: Any,
    reward_fn: Callable,
    settings: Any,
    checks: Any = None,
) -> str | None:
    """The digest that names this evaluation's result, or None when it cannot be known from
    what the key sees (see the module's docstring)."""
    reward = reward_identity(reward_fn)
    weights = weights_fingerprint(model) if reward is not None else None  # no hashing in vain
    if weights is None:
        return None
    parts = {
        "weights": weights,
        "config": _json_of(getattr(model, "config", None)),
        "generation": _json_of(getattr(model, "generation_config", None)),
        "tokenizer": tokenizer_identity(tokenizer),
        "rows": rows_digest(dataset),
        "reward": reward,
        "settings": _settings_that_matter(settings),
        "checks": repr(checks),
        "where": where_it_runs(model),
    }
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _settings_that_matter(settings: Any) -> dict[str, Any]:
    """The settings; greedy only (no samples), the seed and the sampling parameters but the
    length do not change a number, so runs of another seed share the result."""
    fields = asdict(settings)
    if not settings.num_samples:
        fields.update(seed=None, sampling={"max_new_tokens": settings.sampling.max_new_tokens})
    return fields


def _json_of(config: Any) -> str | None:
    return config.to_json_string(use_diff=False) if config is not None else None


def store_dir() -> Path | None:
    """`$GRPO_PLUGIN_EVAL_CACHE` (a folder; `off`: no cache), else the plugin's cache folder's
    `evaluations/`."""
    chosen = os.environ.get(ENV, "").strip()
    if chosen.lower() == "off":
        return None
    return Path(chosen).expanduser() if chosen else cache_dir() / SUBDIR


def known_result(key: str) -> dict[str, Any] | None:
    """The stored result under `key`, or None (no cache, missing, unreadable, not a result)."""
    store = store_dir()
    try:
        entry = json.loads((store / f"{key}.json").read_text()) if store else None
    except (OSError, ValueError):
        return None
    result = entry.get("result") if isinstance(entry, dict) else None
    return result if isinstance(result, dict) and "accuracy" in result else None


def remember(key: str, result: dict[str, Any]) -> None:
    """Store `result` under `key`: written beside and renamed into place, so a reader never
    sees half a file; a cache that cannot be written is skipped with one log line."""
    store = store_dir()
    if store is None:
        return
    path = store / f"{key}.json"
    try:
        store.mkdir(parents=True, exist_ok=True)
        partial_file = path.with_suffix(f".{os.getpid()}.tmp")
        partial_file.write_text(json.dumps({"result": result}, sort_keys=True))
        partial_file.replace(path)
    except OSError as err:
        logger.info("The evaluation's result was not cached (%s): %s", store, err)
