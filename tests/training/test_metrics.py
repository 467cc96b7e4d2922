"""`training/metrics.py`: the zero-spread watch."""

import logging

from grpo_plugin.training.metrics import ZeroStdWatch


def test_the_zero_spread_warning_comes_once_and_says_which_end_the_reward_is_at(caplog):
    watch = ZeroStdWatch(patience=2)
    solved = {"frac_reward_zero_std": 1.0, "reward": 1.0}
    with caplog.at_level(logging.WARNING, logger="grpo_plugin.training.metrics"):
        watch.update({"frac_reward_zero_std": 0.5, "reward": 0.7})
        watch.update(solved)
        assert not caplog.records  # one rollout is not a streak
        watch.update(solved)
        watch.update(solved)  # the streak goes on: no second warning
    assert len(caplog.records) == 1 and watch.streak == 3
    message = caplog.records[0].getMessage()
    assert "2 rollouts in a row" in message and "(mean reward 1 in the last one)" in message
    assert "the task is solved: stop, or give harder prompts" in message
    watch.update({"frac_reward_zero_std": 0.25, "reward": 0.9})
    assert watch.streak == 0
