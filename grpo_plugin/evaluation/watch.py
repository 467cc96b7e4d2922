"""Watching the evaluations of a run: the best step, and an alarm when reward and task part ways.

A GRPO policy can learn to please the reward function instead of solving the task ("reward
hacking", Skalse et al. 2022, https://arxiv.org/abs/2209.13085): the training reward climbs while
the held-out task metric falls. `RewardHackingCallback` compares the last `window` evaluations
(first against last): when the mean training reward over the steps before each evaluation rose by
more than `threshold` while the held-out metric got worse by more than `threshold` (each in its
own units), it logs one warning naming both numbers and the steps. It warns once per run; every
such window is listed in the run summary (`grpo_run.json`, then the model card).

Everything is computed from `TrainerState.log_history` (training logs carry `reward`, evaluation
logs the `eval_*` keys), so a resumed run sees the evaluations from before the interruption.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from transformers import TrainerCallback

from .curve import best_point
from .setup import best_metric_key

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalRecord:
    """One evaluation: its step, the held-out metric, and the mean training reward logged over
    the steps since the previous evaluation (None when no training step was logged in between)."""

    step: int
    metric: float
    train_reward: float | None


@dataclass(frozen=True)
class Divergence:
    """The training reward rose while the held-out metric got worse, between two evaluations."""

    metric: str
    first_step: int
    last_step: int
    reward_from: float
    reward_to: float
    metric_from: float
    metric_to: float

    def message(self) -> str:
        return (
            f"Possible reward hacking: from step {self.first_step} to step {self.last_step} the "
            f"mean training reward rose from {self.reward_from:.3f} to {self.reward_to:.3f} while "
            f"the held-out {self.metric} went from {self.metric_from:.3f} to {self.metric_to:.3f}."
            " Read the completions (log_completions) before trusting the reward."
        )


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def eval_records(log_history: Sequence[dict[str, Any]], metric: str) -> list[EvalRecord]:
    """The evaluations in a log history that logged `metric`, each with its interval's mean
    training reward."""
    records, rewards = [], []
    for entry in log_history:
        if _number(entry.get("reward")):
            rewards.append(float(entry["reward"]))
        if _number(entry.get(metric)) and _number(entry.get("step")):
            reward = sum(rewards) / len(rewards) if rewards else None
            records.append(EvalRecord(int(entry["step"]), float(entry[metric]), reward))
            rewards = []
    return records


def find_divergence(
    records: Sequence[EvalRecord],
    metric: str,
    window: int = 2,
    threshold: float = 0.05,
    greater_is_better: bool = True,
) -> Divergence | None:
    """The divergence over the last `window` evaluations that have a training reward, if any."""
    usable = [r for r in records if r.train_reward is not None]
    if window < 2 or len(usable) < window:
        return None
    first, last = usable[-window], usable[-1]
    rise = last.train_reward - first.train_reward
    worse = first.metric - last.metric if greater_is_better else last.metric - first.metric
    if rise > threshold and worse > threshold:
        return Divergence(
            metric,
            first.step,
            last.step,
            first.train_reward,
            last.train_reward,
            first.metric,
            last.metric,
        )
    return None


def all_divergences(
    records: Sequence[EvalRecord], metric: str, window: int, threshold: float, greater: bool
) -> list[Divergence]:
    """Every window of the run that diverged (what the summary and the card list)."""
    found = (
        find_divergence(records[: i + 1], metric, window, threshold, greater)
        for i in range(len(records))
    )
    return [d for d in found if d is not None]


class RewardHackingCallback(TrainerCallback):
    """Warns once when the training reward rises while the held-out metric falls; knows the best
    step. `default_metric` is watched unless `metric_for_best_model` is set."""

    def __init__(self, default_metric: str = "eval_accuracy") -> None:
        self.default_metric = default_metric
        self.warned = False
        self.restored_step: int | None = None  # the best checkpoint's step, once loaded at the end

    def state_dict(self) -> dict[str, bool]:
        """What a resume restores (`run/state.py`): the alarm speaks once per run."""
        return {"warned": self.warned}

    def load_state_dict(self, state: dict[str, bool]) -> None:
        self.warned = state["warned"]

    def metric(self, args: Any) -> tuple[str, bool]:
        """(the watched metric, whether greater is better)."""
        if args.metric_for_best_model:
            greater = args.greater_is_better is not False
            return best_metric_key(args.metric_for_best_model), greater
        return self.default_metric, True

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        window = args.reward_hacking_window
        if self.warned or window < 2:
            return
        metric, greater = self.metric(args)
        records = eval_records(state.log_history, metric)
        divergence = find_divergence(
            records, metric, window, args.reward_hacking_threshold, greater
        )
        if divergence is not None and divergence.last_step == state.global_step:
            self.warned = True
            if getattr(state, "is_world_process_zero", True):  # one warning, not one per process
                logger.warning(divergence.message())

    def on_train_end(self, args, state, control, **kwargs):
        match = re.search(r"checkpoint-(\d+)$", str(state.best_model_checkpoint or "").rstrip("/"))
        if args.load_best_model_at_end and match:  # the Trainer has just loaded it
            self.restored_step = int(match.group(1))

    def summary(self, args: Any, state: Any) -> dict[str, Any]:
        """What `grpo_run.json` records: the watched metric, the best step, the alarms."""
        metric, greater = self.metric(args)
        records = eval_records(state.log_history, metric)
        out: dict[str, Any] = {"metric": metric, "evaluations": len(records)}
        if args.metric_for_best_model and records:
            best = best_point(state.log_history, metric, greater)
            out.update(best_step=best[0], best_metric=best[1])
            out["weights_step"] = self.restored_step or state.global_step
        if args.reward_hacking_window >= 2:
            found = all_divergences(
                records, metric, args.reward_hacking_window, args.reward_hacking_threshold, greater
            )
            out["alarms"] = [{**asdict(d), "message": d.message()} for d in found]
        return out
