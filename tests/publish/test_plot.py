"""The training curve, drawn from a run dir's metrics.jsonl (with evaluation lines) and eval.json:
the data it is drawn from, and the PNG."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import RUN_INFO

from grpo_plugin.publish.plot import curve_data, plot_reward_curve, trailing_mean
from grpo_plugin.run.rundir import read_metrics


def _write_run(path, *, beta=0.04, eval_json=None):
    """16 training steps; evaluations (n = 8) at steps 4, 8 and 12 with 2, 4 and 8 right."""
    path.mkdir(parents=True)
    info = {**RUN_INFO, "global_step": 16, "objective": {**RUN_INFO["objective"], "beta": beta}}
    (path / "grpo_run.json").write_text(json.dumps(info))
    rows = []
    for step in range(1, 17):
        reward = 0.1 if step % 2 else 0.3  # zig-zag: the smoothing must flatten it
        rows.append({"step": step, "reward": reward, "kl": 0.001 * step,
                     "completions/mean_length": 10.0 + step})  # fmt: skip
        if step % 4 == 0 and step < 16:
            rows.append({"step": step, "eval_accuracy": step / 8 / 1.5 if step < 12 else 1.0,
                         "eval_n": 8, "eval_loss": 0.0})  # fmt: skip
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    if eval_json is not None:
        (path / "eval.json").write_text(json.dumps(eval_json))
    return path


def test_trailing_mean_by_hand():
    assert trailing_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert trailing_mean([1.0, 3.0], 1) == [1.0, 3.0]


def test_curve_data_from_metrics_with_eval_lines(tmp_path):
    run = _write_run(tmp_path / "run")
    assert len(read_metrics(run)) == 19  # 16 training lines + 3 evaluation lines
    data = curve_data(run)
    assert data.reward_steps == list(range(1, 17)) and data.rewards[:2] == [0.1, 0.3]
    assert data.window == 2  # 16 steps // 8
    assert data.smoothed[0] == 0.1 and data.smoothed[1:] == pytest.approx([0.2] * 15)
    # no eval.json: the points are the logged evaluations, with their Wilson intervals
    assert [(p["step"], p["accuracy"], p["n"]) for p in data.eval_points] == [
        (4, pytest.approx(1 / 3), 8), (8, pytest.approx(2 / 3), 8), (12, 1.0, 8),
    ]  # fmt: skip
    assert data.eval_points[-1]["ci95"] == [0.6756, 1.0]  # 8/8: see test_eval_curve
    assert data.lengths == [10.0 + s for s in range(1, 17)]
    assert data.kls == pytest.approx([0.001 * s for s in range(1, 17)])  # beta > 0: KL drawn
    assert data.title == "DAPO training"


def test_eval_json_curve_wins_and_kl_is_hidden_at_beta_0(tmp_path):
    curve = [{"step": 0, "accuracy": 0.0, "ci95": [0.0, 0.3244], "n": 8},
             {"step": 16, "accuracy": 0.5, "ci95": [0.2152, 0.7848], "n": 8}]  # fmt: skip
    run = _write_run(tmp_path / "run", beta=0.0, eval_json={"curve": curve})
    data = curve_data(run)
    assert data.eval_points == curve
    assert data.kls == [] and data.kl_steps == []


def test_reward_curve_png(tmp_path):
    import matplotlib.image as mpimg

    run = _write_run(tmp_path / "run")
    image = mpimg.imread(plot_reward_curve(run))
    assert image.shape == (560, 640, 4)
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    empty = mpimg.imread(plot_reward_curve(empty_dir))
    assert empty.shape == image.shape
    changed = np.abs(image[..., :3] - empty[..., :3]).sum(-1) > 0.1
    assert changed.mean() > 0.01

    # the held-out points and bars are drawn in matplotlib's tab:orange (255, 127, 14); the
    # empty figure has only its orange axis label
    def orange(img):
        return int((np.abs(img[..., :3] - np.array([255, 127, 14]) / 255).sum(-1) < 0.05).sum())

    assert orange(image) > orange(empty) + 100
