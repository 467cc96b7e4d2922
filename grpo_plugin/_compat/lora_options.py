"""peft 0.21's LoRA options, read before the model loads (see the table in `_compat/__init__.py`)."""

from __future__ import annotations

from typing import Any

__all__ = ["LORA_INIT_OPTIONS", "lora_init_known", "lora_variant_fields"]

# peft 0.21's `init_lora_weights` strings (besides True/False); "pissa_niter_N" too. peft checks
# them only when it builds the adapter, after the model has loaded.
LORA_INIT_OPTIONS = ("gaussian", "eva", "olora", "pissa", "corda", "loftq", "orthogonal", "mica")


def lora_init_known(value: Any) -> bool:
    """Whether peft 0.21 knows the `init_lora_weights` string `value`."""
    if not isinstance(value, str):
        return False
    niter = value.removeprefix("pissa_niter_")
    return value in LORA_INIT_OPTIONS or (niter != value and niter.isdigit())


def lora_variant_fields(config: Any) -> list[str]:
    """The fields of a peft `LoraConfig` that select a LoRA variant (DoRA, aLoRA, MiCA, ...),
    as peft 0.21 reads them: a field whose metadata says `is_lora_variant` and whose value is
    truthy, or `init_lora_weights` set to one of the variants its metadata lists. [] for a plain
    LoRA (or no config)."""
    import dataclasses

    if config is None or not dataclasses.is_dataclass(config):
        return []
    found = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name, None)
        if f.metadata.get("is_lora_variant") and value:
            found.append(f.name)
        elif f.name == "init_lora_weights" and value in f.metadata.get("lora_variants", ()):
            found.append(f"init_lora_weights={value!r}")
    return found
