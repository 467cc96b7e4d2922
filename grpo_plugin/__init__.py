"""grpo-plugin: GRPO-family RL with verifiable rewards, as a TRL-style trainer.

`from grpo_plugin import GRPOConfig, GRPOTrainer` mirrors `trl`. The package is a ladder of rooms,
one concern each, each importing only the rooms below it (docs/architecture.md draws it):
`core/` (tensor math) < `engine/` (every forward of the policy) < `models/` (loading) <
`user_code/` < `rollout/` (group sampling) < `config/` < `distributed.py` < `scoring/` (rewards
and advantages) < `run/` (the run folder) < `evaluation/` < `publish/` < `training/` (the
trainer) < `app/` (recipes) < `cli.py`.

Imports are lazy so that `grpo_plugin.core.objectives` stays a light, pure-torch module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ._version import __version__

_EXPORTS = {
    "GRPOConfig": "grpo_plugin.config.grpo_config",
    "GRPOTrainer": "grpo_plugin.training.trainer",
    "load_policy": "grpo_plugin.models.policy",
    "EvalSettings": "grpo_plugin.evaluation.evaluator",
    "SamplingParams": "grpo_plugin.rollout.types",
    "evaluate": "grpo_plugin.evaluation.evaluator",
    "run_recipe": "grpo_plugin.app.pipeline",
    "load_recipe": "grpo_plugin.app.recipe",
    "ArithmeticProblems": "grpo_plugin.app.data",
    "arithmetic_dataset": "grpo_plugin.app.data",
    "gsm8k_dataset": "grpo_plugin.app.data",
}
__all__ = [
    "ArithmeticProblems",
    "EvalSettings",
    "GRPOConfig",
    "GRPOTrainer",
    "SamplingParams",
    "__version__",
    "arithmetic_dataset",
    "evaluate",
    "gsm8k_dataset",
    "load_policy",
    "load_recipe",
    "run_recipe",
]

if TYPE_CHECKING:
    from .app.data import ArithmeticProblems, arithmetic_dataset, gsm8k_dataset
    from .app.pipeline import run_recipe
    from .app.recipe import load_recipe
    from .config.grpo_config import GRPOConfig
    from .evaluation.evaluator import EvalSettings, evaluate
    from .models.policy import load_policy
    from .rollout.types import SamplingParams
    from .training.trainer import GRPOTrainer


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'grpo_plugin' has no attribute {name!r}")
