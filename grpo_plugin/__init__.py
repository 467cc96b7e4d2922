"""grpo-plugin: GRPO-family RL with verifiable rewards, as a TRL-style trainer.

`from grpo_plugin import GRPOConfig, GRPOTrainer` mirrors `trl`. The heavy imports are lazy so
that `grpo_plugin.objectives` stays a light, pure-torch module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"
__all__ = ["GRPOConfig", "GRPOTrainer", "__version__"]

if TYPE_CHECKING:
    from .config import GRPOConfig
    from .trainer import GRPOTrainer


def __getattr__(name: str):
    if name == "GRPOConfig":
        from .config import GRPOConfig

        return GRPOConfig
    if name == "GRPOTrainer":
        from .trainer import GRPOTrainer

        return GRPOTrainer
    raise AttributeError(f"module 'grpo_plugin' has no attribute {name!r}")
