"""The sync check of `use_vllm` (`check_rollout_drift`); the other guards are tested through
the trainer in test_lifecycle.py."""

from __future__ import annotations

import pytest

from grpo_plugin.run.guards import DRIFT_METRIC, RolloutDriftError, check_rollout_drift


def test_a_drift_above_the_limit_stops_the_run_naming_the_step():
    with pytest.raises(
        RolloutDriftError, match=r"^step 4: vLLM's samples have log-probs 0\.75 "
    ) as e:
        check_rollout_drift({DRIFT_METRIC: 0.75}, limit=0.5, step=3)
    assert "vllm_max_logp_drift=0.5" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("metrics", "limit"), [({DRIFT_METRIC: 0.5}, 0.5), ({DRIFT_METRIC: 9.0}, None), ({}, 0.5)]
)
def test_a_drift_within_the_limit_unchecked_or_unmeasured_passes(metrics, limit):
    check_rollout_drift(metrics, limit, step=0)  # at the limit, no limit, no sampled log-probs
