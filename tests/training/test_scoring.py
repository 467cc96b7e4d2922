"""Reward calling: TRL's contract, NaN for None, named errors, concurrent async rewards."""

import asyncio
import math
import time

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
    async def slow(prompts, completions, **kw):
        await asyncio.sleep(0.3)
        return [1.0] * len(completions)

    async def slow_too(prompts, completions, **kw):
        await asyncio.sleep(0.3)
        return [2.0] * len(completions)

    start = time.perf_counter()
    out = call([slow, slow_too], ["a", "b"])
    assert time.perf_counter() - start < 0.55  # 0.6 s if run one after the other
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
