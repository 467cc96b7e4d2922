"""The training curve, drawn from a run dir's metrics.jsonl and eval.json."""

from __future__ import annotations

import numpy as np

from grpo_plugin.app.plot import _accuracy_points, plot_reward_curve
from grpo_plugin.training.rundir import read_metrics


def test_accuracy_points_and_metrics_reading(run_dir):
    rows = read_metrics(run_dir)
    assert len(rows) == 40  # the truncated 41st line is skipped
    steps, accs = _accuracy_points(run_dir, rows)
    assert list(zip(steps, accs)) == [(0, 0.4375), (20, 0.5), (40, 0.71875)]


def test_reward_curve_png(run_dir, tmp_path):
    import matplotlib.image as mpimg

    image = mpimg.imread(run_dir / "reward_curve.png")
    assert image.shape == (360, 640, 4)
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    empty = mpimg.imread(plot_reward_curve(empty_dir))
    assert empty.shape == image.shape
    # the curves change a visible share of the pixels compared with the empty plot
    changed = np.abs(image[..., :3] - empty[..., :3]).sum(-1) > 0.1
    assert changed.mean() > 0.005
