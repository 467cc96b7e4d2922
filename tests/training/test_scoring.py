"""Reward calling: TRL's contract, NaN for None, named errors, concurrent async rewards."""

import asyncio
import math

import pytest
import torch

from grpo_plugin.training.scoring import RewardFunctionError, combine_rewards, score_completions


def call(funcs, completions, **columns):
    ids = [[1]] * len(completions)
    return score_completions(funcs, ["p"] * len(completions), completions, ids, columns)


def test_columns_reach_rewards_and_none_is_nan():
    def matches(prompts, completions, completion_ids, answer, **kw):
        return [None if a == "?" else float(c == a) for c, a in zip(completions, answer)]

    out = call([matches], ["1", "2", "3"], answer=["1", "x", "?"])
    assert out.shape == (3, 1)
    assert out[:2, 0].tolist() == [1.0, 0.0] and math.isnan(out[2, 0])


def test_async_rewards_run_concurrently():
    """Both coroutines are in flight at once: each starts before either finishes."""
    events = []

    def reward(value):
        async def fn(prompts, completions, **kw):
            events.append(f"start {value}")
            await asyncio.sleep(0.05)
            events.append(f"end {value}")
            return [value] * len(completions)

        fn.__name__ = f"reward_{int(value)}"
        return fn

    out = call([reward(1.0), reward(2.0)], ["a", "b"])
    assert events[:2] == ["start 1.0", "start 2.0"] and sorted(events[2:]) == ["end 1.0", "end 2.0"]
    assert out.tolist() == [[1.0, 2.0], [1.0, 2.0]]


def test_async_rewards_work_inside_a_running_loop():
    async def reward(prompts, completions, **kw):
        return [0.5] * len(completions)

    async def caller():
        return call([reward], ["a"])

    assert asyncio.run(caller()).tolist() == [[0.5]]


def scalar(prompts, completions, **kw):
    return 1.0


def text(prompts, completions, **kw):
    return ["high"]


def test_wrong_type_and_value_are_named():
    with pytest.raises(RewardFunctionError, match="'scalar' returned float"):
        call([scalar], ["a"])
    with pytest.raises(RewardFunctionError, match="'text' returned 'high' for sample 0"):
        call([text], ["a"])


def test_combine_weights_and_ignores_unscored():
    per_func = torch.tensor([[1.0, 0.5], [math.nan, 1.0], [math.nan, math.nan]])
    out = combine_rewards(per_func, torch.tensor([2.0, 1.0]))
    assert out[:2].tolist() == [2.5, 1.0] and math.isnan(out[2])
