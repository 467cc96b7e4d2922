"""The training curve (`reward_curve.png`): mean reward and held-out accuracy against step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..training.rundir import CURVE_FILE, EVAL_FILE, load_run_info, read_json, read_metrics
from .card import objective_display_name


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    points = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return [p[0] for p in points], [p[1] for p in points]


def _accuracy_points(output_dir: Path, rows: list[dict[str, Any]]) -> tuple[list, list]:
    """Held-out accuracy against step: eval.json's before (step 0) and after, plus eval/accuracy."""
    steps, accs = _series(rows, "eval/accuracy")
    evaluation = read_json(output_dir / EVAL_FILE) or {}
    last_step = load_run_info(output_dir).get("global_step") or max(
        (r["step"] for r in rows), default=0
    )
    for step, key in ((0, "before"), (last_step, "after")):
        accuracy = (evaluation.get(key) or {}).get("accuracy")
        if isinstance(accuracy, (int, float)):
            steps.append(step)
            accs.append(accuracy)
    points = sorted(zip(steps, accs))
    return [p[0] for p in points], [p[1] for p in points]


def plot_reward_curve(output_dir: str | Path) -> Path:
    """Plot mean reward (left axis) and held-out accuracy (right axis) against step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    output_dir = Path(output_dir)
    rows = read_metrics(output_dir)
    reward_steps, rewards = _series(rows, "reward")
    acc_steps, accs = _accuracy_points(output_dir, rows)

    fig, reward_ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    reward_ax.plot(reward_steps, rewards, color="tab:blue", label="train reward (mean)")
    reward_ax.set_xlabel("step")
    reward_ax.set_ylabel("reward", color="tab:blue")
    acc_ax = reward_ax.twinx()
    acc_ax.plot(acc_steps, accs, "o--", color="tab:orange", label="held-out accuracy")
    acc_ax.set_ylabel("held-out accuracy", color="tab:orange")
    acc_ax.set_ylim(-0.02, 1.02)
    if not rewards and not accs:
        reward_ax.text(0.5, 0.5, "no metrics logged", ha="center", transform=reward_ax.transAxes)
    handles = reward_ax.get_legend_handles_labels()[0] + acc_ax.get_legend_handles_labels()[0]
    reward_ax.legend(handles=handles, loc="lower right", fontsize="small")
    run = load_run_info(output_dir)
    reward_ax.set_title(f"{objective_display_name(run)} training")
    fig.tight_layout()
    path = output_dir / CURVE_FILE
    fig.savefig(path)
    plt.close(fig)
    return path
