"""The public attributes TRL 1.16's `GRPOTrainer.__init__` sets, with TRL's types and values, for
user code and callbacks that read them (`trainer.beta`, `trainer.reward_weights`, ...).

Each is a view of what the trainer already holds: the config (`self.args`, the trainer's own
copy), the reward sources (`self.rewards`) and the loss (`self.training_objective`), so there is
one value and no copy to drift. The config copies can be set too, as TRL's plain attributes can:
the value goes to the trainer's `args` and is read from there by the next rollout
(`trainer.temperature = 0.7`); set them before `train()` for the ones fixed at construction
(`beta`, `num_generations`).

TRL's public helpers `get_high_entropy_mask` and `get_off_policy_mask` are here too, with TRL's
signatures, over the same equations the loss uses (`core/masks.py`). Reading `entropy_coef` during training gives the adaptive
coefficient's current value, as TRL's attribute does. Attributes TRL has only for vLLM or
continuous batching are given their config values; the reasons for the few that differ are in
docs/differences-from-trl.md.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from .. import distributed
from ..core.masks import high_entropy_mask, off_policy_mask
from ..scoring.reward_models import is_reward_model

# TRL attribute -> the config field it copies, unchanged.
CONFIG_COPIES = (
    "max_completion_length",
    "num_generations",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "use_transformers_continuous_batching",
    "pad_to_multiple_of",
    "use_vllm",
    "vllm_mode",
    "vllm_gpu_memory_utilization",
    "vllm_tensor_parallel_size",
    "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode",
    "vllm_importance_sampling_clip_max",
    "vllm_importance_sampling_clip_min",
    "loss_type",
    "multi_objective_aggregation",
    "scale_rewards",
    "importance_sampling_level",
    "off_policy_mask_threshold",
    "mask_truncated_completions",
    "top_entropy_quantile",
    "use_adaptive_entropy",
    "shuffle_dataset",
    "num_iterations",
    "beta",
    "log_completions",
    "log_multimodal",
    "log_unique_prompts",
    "num_completions_to_print",
)


def _config_copy(name: str) -> property:
    return property(
        lambda self: getattr(self.args, name),
        lambda self, value: setattr(self.args, name, value),
        doc=f"`args.{name}` (as TRL's attribute; setting it sets the trainer's args).",
    )


class TRLAttributes:
    """Mixin for `GRPOTrainer`: TRL's public attribute names (see the module docstring)."""

    args: Any
    rewards: Any
    tool_setup: Any
    training_objective: Any

    # --- rewards: TRL's lists and its float32 weight tensor, environments' rewards last -------
    @property
    def reward_funcs(self) -> list:
        """As given: the user's callables and reward models (`nn.Module`), as TRL holds them."""
        return [_as_given(f) for f in self.rewards.funcs]

    @property
    def reward_func_names(self) -> list[str]:
        return self.rewards.names

    @property
    def reward_names(self) -> list[str]:
        """Ours (older name of `reward_func_names`)."""
        return self.rewards.names

    @property
    def reward_weights(self) -> torch.Tensor:
        return self.rewards.weights

    @property
    def reward_processing_classes(self) -> list:
        return self.rewards.processing_classes

    # --- generation and the objective -----------------------------------------------------------
    @property
    def num_generations_eval(self) -> int:
        return self.args.num_generations_eval or self.args.num_generations

    @property
    def chat_template_kwargs(self) -> dict:
        return self.args.chat_template_kwargs or {}

    @property
    def max_tool_calling_iterations(self) -> int:
        limit = self.args.max_tool_calling_iterations
        return sys.maxsize if limit is None else limit

    @property
    def epsilon_low(self) -> float:
        return self.args.epsilon

    @property
    def epsilon_high(self) -> float:
        high = self.args.epsilon_high
        return self.args.epsilon if high is None else high

    @property
    def entropy_coef(self) -> float:
        """The entropy bonus's coefficient now: with `use_adaptive_entropy` it moves each step."""
        return self.training_objective.entropy.coef

    @property
    def router_aux_loss_coef(self) -> float:
        """The configured coefficient, else the model config's own (0.0 when it has none)."""
        coef = self.args.router_aux_loss_coef
        if coef is not None:
            return coef
        text_config = self.model.config.get_text_config()
        return getattr(text_config, "router_aux_loss_coef", 0.0)

    @property
    def aux_loss_enabled(self) -> bool:
        """True when the MoE router's load-balancing loss is added (as TRL's)."""
        text_config = self.model.config.get_text_config()
        return hasattr(text_config, "output_router_logits") and self.router_aux_loss_coef != 0.0

    @property
    def environments(self) -> list | None:
        """TRL's: the live `environment_factory` instances (row i of a rollout is served by the
        i-th of its factory's); None without environments."""
        setup = self.tool_setup
        if setup is None or setup.environments is None:
            return None
        return [instance for pool in setup.environments.pool.values() for instance in pool]

    # --- TRL's public helpers ------------------------------------------------------------------
    def get_high_entropy_mask(
        self, entropies: torch.Tensor, mask: torch.Tensor, threshold: float
    ) -> torch.Tensor:
        """TRL's: `(B, T)` bool, the valid tokens whose entropy is at least the `threshold`
        quantile of every process's valid entropies (TRL passes `1 - top_entropy_quantile`)."""
        local = entropies[mask.bool()].float().cpu()  # (M,)
        pool = torch.cat(distributed.gather_objects(self.accelerator, local))  # (M_all,)
        top = 1.0 - threshold
        return high_entropy_mask(entropies, mask, top, pool=pool.to(entropies.device))

    @staticmethod
    def get_off_policy_mask(
        advantages: torch.Tensor,
        per_token_logps: torch.Tensor,
        sampling_per_token_logps: torch.Tensor,
        mask: torch.Tensor,
        off_policy_threshold: float,
    ) -> torch.Tensor:
        """TRL's: `(B, 1)`, 0 for a sequence with a negative advantage whose mean
        `log pi_old - log pi` over its valid tokens exceeds `off_policy_threshold`, else 1."""
        keep = off_policy_mask(
            advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold
        )
        return keep.to(mask.dtype)


for _name in CONFIG_COPIES:
    setattr(TRLAttributes, _name, _config_copy(_name))


def _as_given(func: Any) -> Any:
    """A reward as the user gave it: the model inside our reward-model wrapper, the function
    inside the one that passes it the trainer kwargs."""
    if is_reward_model(func):
        return func.model
    return getattr(func, "__wrapped__", func)
