"""What a rollout tells the user: TRL-named reward metrics, completion tables, and run facts."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import __version__
from .dynamic_sampling import ScoredRollout, informative_groups


def nanstd(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Population std ignoring NaN (0 where nothing was scored)."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    return torch.nanmean((x - mean) ** 2, dim=dim).sqrt().nan_to_num(0.0)


def reward_metrics(s: ScoredRollout, group_size: int, names: Sequence[str]) -> dict[str, float]:
    """TRL's metric names: reward, reward_std (mean within-group std), rewards/<fn>/{mean,std}, ..."""
    out = {
        "reward": torch.nanmean(s.rewards).item(),
        "reward_std": torch.nanmean(nanstd(s.rewards.view(-1, group_size), dim=1)).item(),
        "frac_reward_zero_std": 1.0
        - informative_groups(s.rewards, group_size).float().mean().item(),
        "completions/mean_length": s.batch.completion_mask.sum(dim=1).float().mean().item(),
        "completions/clipped_ratio": s.batch.is_truncated.float().mean().item(),
    }
    for j, name in enumerate(names):
        out[f"rewards/{name}/mean"] = torch.nanmean(s.per_func[:, j]).item()
        out[f"rewards/{name}/std"] = nanstd(s.per_func[:, j], dim=0).item()
    return out


def completion_records(
    s: ScoredRollout, advantages: torch.Tensor, names: Sequence[str], step: int
) -> dict[str, list]:
    """Columns of `completions/step_XXXXX.parquet`: one row per completion."""
    group_size = len(s.completions) // max(1, len(s.rows))
    records: dict[str, list] = {
        "step": [step] * len(s.completions),
        "prompt": [r["prompt"] for r in s.rows for _ in range(group_size)],
        "completion": s.completions,
        "reward": s.rewards.tolist(),
        "advantage": advantages.tolist(),
    }
    for j, name in enumerate(names):
        records[f"rewards/{name}"] = s.per_func[:, j].tolist()
    return records


def _lora_summary(model: Any) -> dict[str, Any] | None:
    peft_config = getattr(model, "peft_config", None)
    if not peft_config:
        return None
    cfg = peft_config[model.active_adapter]
    targets = cfg.target_modules
    targets = sorted(targets) if isinstance(targets, set) else targets
    return {"r": cfg.r, "lora_alpha": cfg.lora_alpha, "target_modules": targets}


def run_summary(
    args: Any,
    model: Any,
    model_name: str,
    reward_funcs: Sequence[Callable],
    reward_weights: torch.Tensor,
    global_step: int,
) -> dict[str, Any]:
    """The facts written to `grpo_run.json` (read by `grpo_plugin.card` and `grpo_plugin.hub`)."""
    from .models import EMBEDDED_HUB_ID, EMBEDDED_NAME
    from .scoring import reward_name

    lora = _lora_summary(model)
    embedded = model_name == EMBEDDED_NAME
    epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    return {
        "base_model": EMBEDDED_HUB_ID if embedded else model_name,
        "base_model_path": model_name,
        "adapter": lora is not None,
        "load_in_4bit": bool(getattr(model, "is_loaded_in_4bit", False)),
        "objective": {
            "loss_type": args.loss_type,
            "importance_sampling_level": args.importance_sampling_level,
            "advantage_estimator": args.estimator,
            "scale_rewards": args.scale_rewards,
            "num_generations": args.num_generations,
            "beta": args.beta,
            "epsilon": args.epsilon,
            "epsilon_high": epsilon_high,
            "num_iterations": args.num_iterations,
            "dynamic_sampling": args.dynamic_sampling,
        },
        "learning_rate": args.learning_rate,
        "global_step": global_step,
        "max_completion_length": args.max_completion_length,
        "temperature": args.temperature,
        "reward_funcs": [
            {"name": reward_name(f), "weight": float(w)}
            for f, w in zip(reward_funcs, reward_weights)
        ],
        "datasets": list(getattr(args, "dataset_names", None) or []),
        "lora": lora,
        "license": "apache-2.0" if embedded else None,
        "grpo_plugin_version": __version__,
    }
