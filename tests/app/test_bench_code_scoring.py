"""benchmarks/code_scoring.py: the run's scoring share and the sandbox alone, on a small case."""

from __future__ import annotations

import json

import pytest
from conftest import REPO_ROOT, load_script

from reward_fns import sandbox


@pytest.fixture(scope="module")
def bench():
    return load_script(REPO_ROOT / "benchmarks" / "code_scoring.py", "code_scoring")


def test_the_share_is_the_scoring_over_the_step(bench, tmp_path):
    rows = [
        {"step": 1, "timing/generate_s": 3.0, "timing/reward_s": 1.0, "timing/train_s": 4.0,
         "step_time": 10.0},
        {"step": 2, "timing/generate_s": 3.0, "timing/reward_s": 0.5, "timing/train_s": 4.5},
        {"step": 2, "eval_accuracy": 0.5},
    ]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    shares = bench.run_shares(tmp_path, completions=16)
    assert shares["steps"] == 2 and shares["max_share"] == pytest.approx(0.1)  # 1 / 10
    assert shares["median_share"] == pytest.approx((0.1 + 0.0625) / 2)  # 0.5 / 8
    assert shares["median_s_per_completion"] == pytest.approx(0.75 / 16)


def test_the_sandbox_alone_scores_right_and_wrong_programs(bench):
    try:
        sandbox.isolation_level("strict")
    except sandbox.IsolationError as err:
        pytest.skip(f"no strict sandbox here: {err}")
    timings = bench.sandbox_alone(programs=4, rounds=1)  # asserts the scores inside
    assert set(timings) == {"batched_s_per_program", "one_at_a_time_s_per_program"}
    assert all(v > 0 for v in timings.values())
