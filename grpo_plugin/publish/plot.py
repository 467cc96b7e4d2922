"""The training curve (`reward_curve.png`), drawn from the run dir's `metrics.jsonl` and `eval.json`.

Top panel: the per-step training reward, faint, under its trailing mean (on the accuracy's 0-1
scale when the rewards fit it); the held-out accuracy at every evaluation (right axis) as points
with their 95% Wilson interval, joined from each measured point to the next. Bottom panel: mean completion length and, when beta > 0, the KL to the
reference, where a collapse (lengths shooting up or down, KL running away) shows first.

`curve_data` returns exactly what is drawn, so it can be checked without reading pixels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..evaluation.curve import build_curve
from ..run.rundir import CURVE_FILE, EVAL_FILE, load_run_info, read_json, read_metrics
from .card import objective_display_name

FIGSIZE, DPI = (6.4, 5.6), 100  # 640 x 560 pixels


@dataclass
class CurveData:
    """The series of the figure; steps are optimizer steps."""

    reward_steps: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    smoothed: list[float] = field(default_factory=list)  # trailing mean over `window` steps
    window: int = 1
    eval_points: list[dict[str, Any]] = field(default_factory=list)  # eval_curve points
    eval_split: str = "held-out"  # or "validation" (eval.json `curve_split`)
    length_steps: list[int] = field(default_factory=list)
    lengths: list[float] = field(default_factory=list)
    kl_steps: list[int] = field(default_factory=list)  # empty when beta == 0
    kls: list[float] = field(default_factory=list)
    title: str = "GRPO training"


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return [p[0] for p in points], [float(p[1]) for p in points]


def smoothing_window(num_steps: int) -> int:
    """About an eighth of the run, between 1 and 50 steps."""
    return max(1, min(50, num_steps // 8))


def trailing_mean(values: list[float], window: int) -> list[float]:
    """Mean of each value and the `window - 1` before it (fewer at the start)."""
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def curve_data(output_dir: str | Path) -> CurveData:
    """What `plot_reward_curve` draws for this run dir."""
    output_dir = Path(output_dir)
    rows = read_metrics(output_dir)
    run = load_run_info(output_dir)
    evaluation = read_json(output_dir / EVAL_FILE) or {}
    data = CurveData(title=f"{objective_display_name(run)} training")
    data.reward_steps, data.rewards = _series(rows, "reward")
    data.window = smoothing_window(len(data.rewards))
    data.smoothed = trailing_mean(data.rewards, data.window)
    last_step = run.get("global_step") or max((r["step"] for r in rows), default=0)
    before, after = evaluation.get("before"), evaluation.get("after")
    data.eval_points = evaluation.get("curve") or build_curve(rows, before, after, last_step)
    if evaluation.get("curve_split") == "validation":
        data.eval_split = "validation"
    data.length_steps, data.lengths = _series(rows, "completions/mean_length")
    beta = (run.get("objective") or {}).get("beta")
    kl_steps, kls = _series(rows, "kl")
    if (beta or 0) > 0 or (beta is None and any(kls)):
        data.kl_steps, data.kls = kl_steps, kls
    return data


def _draw_reward(ax, data: CurveData) -> list:
    ax.plot(
        data.reward_steps,
        data.rewards,
        color="tab:blue",
        alpha=0.3,
        lw=1,
        label="train reward (per step)",
    )
    ax.plot(
        data.reward_steps,
        data.smoothed,
        color="tab:blue",
        lw=2,
        label=f"train reward ({data.window}-step mean)",
    )
    ax.set_ylabel("reward", color="tab:blue")
    if data.rewards and 0.0 <= min(data.rewards) and max(data.rewards) <= 1.0:
        ax.set_ylim(-0.02, 1.02)  # on the accuracy's scale, so the two can be compared by eye
    acc_ax = ax.twinx()
    points = data.eval_points
    if points:
        steps = [p["step"] for p in points]
        accs = [p["accuracy"] for p in points]
        cis = [p.get("ci95") or [a, a] for p, a in zip(points, accs)]
        yerr = [
            [a - lo for a, (lo, _) in zip(accs, cis)],
            [hi - a for a, (_, hi) in zip(accs, cis)],
        ]
        acc_ax.errorbar(
            steps,
            accs,
            yerr=yerr,
            fmt="o-",
            color="tab:orange",
            capsize=3,
            lw=1.2,
            ms=4,
            label=f"{data.eval_split} accuracy (95% CI)",
        )
    acc_ax.set_ylabel(f"{data.eval_split} accuracy", color="tab:orange")
    acc_ax.set_ylim(-0.02, 1.02)
    return ax.get_legend_handles_labels()[0] + acc_ax.get_legend_handles_labels()[0]


def _draw_collapse_watch(ax, data: CurveData) -> list:
    ax.plot(
        data.length_steps,
        data.lengths,
        color="tab:green",
        lw=1.2,
        label="completion length (tokens)",
    )
    ax.set_ylabel("tokens", color="tab:green")
    ax.set_xlabel("step")
    if not data.kls:
        return ax.get_legend_handles_labels()[0]
    kl_ax = ax.twinx()
    kl_ax.plot(data.kl_steps, data.kls, color="tab:red", lw=1.2, label="KL to reference")
    kl_ax.set_ylabel("KL", color="tab:red")
    return ax.get_legend_handles_labels()[0] + kl_ax.get_legend_handles_labels()[0]


def plot_reward_curve(output_dir: str | Path) -> Path:
    """Draw `reward_curve.png` into the run dir (see the module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    output_dir = Path(output_dir)
    data = curve_data(output_dir)
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=FIGSIZE, dpi=DPI, sharex=True, gridspec_kw={"height_ratios": [2, 1]}
    )
    handles = _draw_reward(top, data)
    if handles:
        top.legend(handles=handles, loc="upper left", fontsize="small", framealpha=0.8)
    else:
        top.text(0.5, 0.5, "no metrics logged", ha="center", transform=top.transAxes)
    low_handles = _draw_collapse_watch(bottom, data)
    if low_handles:
        bottom.legend(handles=low_handles, loc="upper left", fontsize="small", framealpha=0.8)
    top.set_title(data.title)
    fig.tight_layout()
    path = output_dir / CURVE_FILE
    fig.savefig(path)
    plt.close(fig)
    return path
