"""The `ActivationCheckpointingFields`, `mirror_activation_checkpointing` row of the table in
`_compat/__init__.py`: the `activation_checkpointing` training argument on transformers < 5.23.

transformers 5.23 renamed `gradient_checkpointing` (and `_kwargs`) to `activation_checkpointing`,
keeping the old names as aliases that mirror the new ones. Before 5.23 only the old names exist,
so a recipe or a TRL script that says `activation_checkpointing: true` would be an unknown key.
There `GRPOConfig` gets the two new fields from `ActivationCheckpointingFields` and
`mirror_activation_checkpointing` makes both names hold one value (the new name wins when set, as
in 5.23+); on 5.23+ both are no-ops and transformers does the same itself.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from transformers import TrainingArguments

__all__ = [
    "ACTIVATION_CHECKPOINTING_NATIVE",
    "ActivationCheckpointingFields",
    "activation_checkpointing_dict_fields",
    "mirror_activation_checkpointing",
]

ACTIVATION_CHECKPOINTING_NATIVE = "activation_checkpointing" in {
    f.name for f in dataclasses.fields(TrainingArguments)
}
_ALIASES = (
    ("gradient_checkpointing", "activation_checkpointing"),
    ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"),
)


@dataclasses.dataclass
class _ActivationCheckpointingFields:
    """transformers 5.23's two fields, for the versions before it: `GRPOConfig`'s first base, so
    that they come after `TrainingArguments`' own (`GRPOConfig("out")` is still `output_dir`)."""

    activation_checkpointing: bool | None = dataclasses.field(
        default=None,
        metadata={
            "help": "Checkpoint the activations (recompute them in the backward pass: less "
            "memory, more time). transformers 5.23's name for `gradient_checkpointing`; on older "
            "versions the two are one setting. None: `gradient_checkpointing`'s value.",
            "nargs": "?",  # a bare `--activation_checkpointing` means True, as on 5.23+
            "const": True,
        },
    )
    activation_checkpointing_kwargs: dict[str, Any] | str | None = dataclasses.field(
        default=None,
        metadata={
            "help": "Keyword arguments of the checkpointing (`gradient_checkpointing_kwargs` "
            "before transformers 5.23). None: `gradient_checkpointing_kwargs`'s value."
        },
    )


class _NoFields:
    """Nothing to add: transformers declares the fields itself (5.23+)."""


ActivationCheckpointingFields: type = (
    _NoFields if ACTIVATION_CHECKPOINTING_NATIVE else _ActivationCheckpointingFields
)


def activation_checkpointing_dict_fields() -> list[str]:
    """The added fields whose JSON strings `TrainingArguments.__post_init__` should parse."""
    return [] if ACTIVATION_CHECKPOINTING_NATIVE else ["activation_checkpointing_kwargs"]


def mirror_activation_checkpointing(config: Any) -> None:
    """Before transformers 5.23: give both names one value, the new one's when it is set (as
    5.23's `TrainingArguments.__post_init__` does). Call before reading `gradient_checkpointing`."""
    if ACTIVATION_CHECKPOINTING_NATIVE:
        return
    for old, new in _ALIASES:
        if getattr(config, new) is not None:
            setattr(config, old, getattr(config, new))
        setattr(config, new, getattr(config, old))
