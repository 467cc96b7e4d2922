"""What a rollout tells the user: TRL-named reward metrics, the metrics window, the zero-std watch."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch

from ..core.tensors import nanstd
from ..rollout.dynamic_sampling import informative_groups
from ..rollout.types import Rollout

logger = logging.getLogger(__name__)


def reward_metrics(r: Rollout, names: Sequence[str]) -> dict[str, float]:
    """TRL's metric names: reward, reward_std (mean within-group std), rewards/<fn>/{mean,std}, ..."""
    group_size = r.group_size
    out = {
        "reward": torch.nanmean(r.rewards).item(),
        "reward_std": torch.nanmean(nanstd(r.rewards.view(-1, group_size), dim=1)).item(),
        "frac_reward_zero_std": 1.0
        - informative_groups(r.rewards, group_size).float().mean().item(),
        **length_metrics(r.batch.model_mask.sum(dim=1).float(), r.batch.is_truncated),
    }
    for j, name in enumerate(names):
        out[f"rewards/{name}/mean"] = torch.nanmean(r.per_func[:, j]).item()
        out[f"rewards/{name}/std"] = nanstd(r.per_func[:, j], dim=0).item()
    return out | tool_metrics(r.batch)


def length_metrics(lengths: torch.Tensor, truncated: torch.Tensor) -> dict[str, float]:
    """TRL's `completions/*`: lengths `(N,)` of all completions and of those that ended (EOS)
    before `max_completion_length` (0 when none did), and the share truncated."""
    ended = lengths[~truncated] if (~truncated).any() else torch.zeros(1)
    return {
        "completions/mean_length": lengths.mean().item(),
        "completions/min_length": lengths.min().item(),
        "completions/max_length": lengths.max().item(),
        "completions/clipped_ratio": truncated.float().mean().item(),
        "completions/mean_terminated_length": ended.mean().item(),
        "completions/min_terminated_length": ended.min().item(),
        "completions/max_terminated_length": ended.max().item(),
    }


def rollout_tokens(r: Rollout) -> int:
    """Prompt and completion tokens of a rollout, as TRL counts them into `num_tokens`."""
    return int(r.batch.prompt_mask.sum()) + int(r.batch.completion_mask.sum())


def tool_metrics(b) -> dict[str, float]:
    """With tools: TRL's `tools/call_frequency` (calls per completion) and
    `tools/failure_frequency` (failed / calls), and ours: `tools/call_rate` (completions with a
    call), `tools/turns_mean`, `tools/prefill_tokens` and `tools/reused_tokens` (history tokens
    later turns found in the KV cache instead of re-encoding them). {} without tools."""
    if b.tool_calls is None:
        return {}
    calls = b.tool_calls.float()  # (N,)
    return {
        "tools/call_frequency": calls.mean().item(),
        "tools/failure_frequency": b.tool_failures.sum().item() / max(1.0, calls.sum().item()),
        "tools/call_rate": (calls > 0).float().mean().item(),
        "tools/turns_mean": b.turns.float().mean().item(),
        "tools/prefill_tokens": float(b.num_prefill_tokens),
        "tools/reused_tokens": float(b.num_reused_tokens),
    }


class MetricsWindow:
    """Metrics collected between two logs; `flush` averages them into one log line.

    Most keys are averaged over the values recorded; the timing keys in `PER_STEP_SUMS` are
    summed per optimizer step and then averaged over the steps of the window (`loss`: the
    micro-batches' losses, each already divided by the accumulation steps); the counters in
    `LATEST` (TRL's cumulative `num_tokens`) keep their last value. A `mirror` window receives
    every value too (the trainer's per-step window for metrics.jsonl beside the logging window).
    """

    LATEST = ("num_tokens",)

    PER_STEP_SUMS = (
        "loss",
        "step_time",
        "timing/generate_s",
        "timing/reward_s",
        "timing/reward_hidden_s",
        "timing/train_s",
    )

    def __init__(self, mirror: MetricsWindow | None = None) -> None:
        self.values: dict[str, list[float]] = defaultdict(list)
        self.last_logged_step = 0
        self.mirror = mirror

    def add(self, key: str, value: float) -> None:
        self.values[key].append(float(value))
        if self.mirror is not None:
            self.mirror.add(key, value)

    def update(self, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.add(key, value)

    def state_dict(self) -> dict[str, Any]:
        return {"values": dict(self.values), "last_logged_step": self.last_logged_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.values.clear()
        self.values.update({k: list(v) for k, v in state["values"].items()})
        self.last_logged_step = state["last_logged_step"]

    def total(self, *keys: str) -> float:
        return sum(sum(self.values.get(key, ())) for key in keys)

    def flush(self, global_step: int, steps: int | None = None) -> dict[str, float]:
        """The window's averages over its `steps` optimizer steps (default: those since the last
        flush); the window starts again empty."""
        steps = steps or max(1, global_step - self.last_logged_step)
        out = {
            key: sum(values) / (steps if key in self.PER_STEP_SUMS else len(values))
            for key, values in self.values.items()
            if values
        }
        out.update({key: self.values[key][-1] for key in self.LATEST if self.values.get(key)})
        self.values.clear()
        self.last_logged_step = global_step
        return out


class ZeroStdWatch:
    """Warns once `patience` rollouts in a row had zero reward std in every group."""

    def __init__(self, patience: int) -> None:
        self.patience, self.streak = patience, 0

    def state_dict(self) -> dict[str, int]:
        return {"streak": self.streak}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.streak = state["streak"]

    def update(self, metrics: dict[str, float], speak: bool = True) -> None:
        """One rollout's reward metrics (`frac_reward_zero_std`, and `reward`, its mean)."""
        self.streak = self.streak + 1 if metrics["frac_reward_zero_std"] >= 1.0 else 0
        if self.streak == self.patience and speak:
            logger.warning(
                "For %d rollouts in a row every group's G rewards were identical (mean reward "
                "%.3g in the last one), so every advantage and the policy loss are 0 and nothing "
                "is learned. If that is the reward's best value the task is solved: stop, or give "
                "harder prompts; if its worst, the task is too hard: raise num_generations or "
                "temperature, use an easier or partial-credit reward, or enable dynamic_sampling.",
                self.streak,
                metrics.get("reward", float("nan")),
            )
