"""Reward calling: TRL's contract, NaN for None, named errors, concurrent async rewards,
non-finite values refused, numpy accepted, time limits. Every test runs twice: the functions in
the worker process (`isolate_user_code`, the default) and in this process."""

import asyncio
import dataclasses
import math
import re
import signal
import time

import numpy as np
import pytest
import torch

from grpo_plugin.scoring import watchdog
from grpo_plugin.scoring.scorer import (
    RewardChecks,
    RewardFunctionError,
    RewardScorer,
    combine_rewards,
)

ISOLATE = {"on": True}
T0 = time.monotonic()


@pytest.fixture(autouse=True, params=[True, False], ids=["worker", "in-process"])
def isolate(request):
    ISOLATE["on"] = request.param
    yield request.param
    ISOLATE["on"] = True


def score_completions(funcs, prompts, completions, ids, columns, checks=None):
    checks = dataclasses.replace(checks or RewardChecks(), isolate=ISOLATE["on"])
    scorer = RewardScorer(tuple(funcs), torch.ones(len(funcs)), checks)
    return scorer.score_columns(prompts, completions, ids, columns)


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
    """Both coroutines are in flight at once: each starts before the other finishes (each
    returns its start and end time, as its two 'rewards', so the order reads the same wherever
    they ran)."""

    def reward(value):
        async def fn(prompts, completions, **kw):
            start = time.monotonic() - T0
            await asyncio.sleep(0.05)
            return [start, time.monotonic() - T0]

        fn.__name__ = f"reward_{int(value)}"
        return fn

    out = call([reward(1.0), reward(2.0)], ["a", "b"]).double()  # (2 [start, end], 2 rewards)
    (start1, start2), (end1, end2) = out.tolist()
    assert start1 < end2 and start2 < end1


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


def constant(value):
    def reward(prompts, completions, **kw):
        return [0.5] + [value] * (len(completions) - 1)

    reward.__name__ = "constant"
    return reward


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (math.inf, "'constant' returned inf for sample 1; rewards must be finite"),
        (-math.inf, "'constant' returned -inf for sample 1; rewards must be finite"),
        (
            1e39,
            "'constant' returned 1e+39 for sample 1; rewards must be finite numbers within float32",
        ),
        (math.nan, "'constant' returned NaN for sample 1; return None for 'not scored'"),
    ],
)
def test_non_finite_rewards_are_errors_naming_the_function_and_sample(value, expected):
    with pytest.raises(RewardFunctionError, match=re.escape(expected)):
        call([constant(value)], ["a", "b"])


def test_nan_can_be_read_as_not_scored_when_asked():
    checks = RewardChecks(nan_as_unscored=True)
    out = score_completions([constant(math.nan)], ["p"] * 2, ["a", "b"], [[1]] * 2, {}, checks)
    assert out[0, 0] == 0.5 and math.isnan(out[1, 0])


def test_float32_max_itself_is_accepted():
    assert (
        call([constant(3.4028234663852886e38)], ["a", "b"])[1, 0] == torch.finfo(torch.float32).max
    )


def test_numpy_arrays_and_scalars_are_accepted():
    def array(prompts, completions, **kw):
        return np.array([0.25, 1.0], dtype=np.float64)

    def scalars(prompts, completions, **kw):
        return [np.float32(0.5), np.int64(2), np.bool_(True)]

    assert call([array], ["a", "b"]).tolist() == [[0.25], [1.0]]
    assert call([scalars], ["a", "b", "c"]).tolist() == [[0.5], [2.0], [1.0]]


def hangs(prompts, completions, **kw):
    time.sleep(60)


def spins_and_swallows(prompts, completions, **kw):
    while True:
        try:
            sum(range(1000))
        except Exception:  # a reward's own broad except cannot eat the timeout
            pass


@pytest.mark.parametrize("reward", [hangs, spins_and_swallows])
def test_a_reward_past_its_timeout_is_an_error_naming_it(reward):
    checks = RewardChecks(timeout=0.3)
    with pytest.raises(
        RewardFunctionError, match=f"'{reward.__name__}' timed out: .* within 0.3 s"
    ):
        score_completions([reward], ["p"], ["a"], [[1]], {}, checks)
    assert signal.getsignal(watchdog.SIGNAL) in (signal.SIG_DFL, None)  # handler restored


def test_an_async_reward_past_its_timeout_is_an_error_naming_it():
    async def never(prompts, completions, **kw):
        await asyncio.sleep(60)

    async def blocks_the_loop(prompts, completions, **kw):
        time.sleep(60)

    checks = RewardChecks(timeout=0.3)
    with pytest.raises(RewardFunctionError, match="'never' timed out"):
        score_completions([never], ["p"], ["a"], [[1]], {}, checks)
    with pytest.raises(
        RewardFunctionError, match="'blocks_the_loop'.* did not return within 1.3 s"
    ):
        score_completions([blocks_the_loop], ["p"], ["a"], [[1]], {}, checks)


def test_a_fast_reward_is_untouched_by_the_timeout():
    checks = RewardChecks(timeout=5.0)
    out = score_completions([constant(1.0)], ["p"] * 2, ["a", "b"], [[1]] * 2, {}, checks)
    assert out.tolist() == [[0.5], [1.0]]


def test_only_the_scorer_calls_reward_functions():
    """Every reward call goes through `RewardScorer` (so the run's checks hold everywhere): no
    other library module calls anything with TRL's reward arguments, or reaches for the scorer's
    internals. (The before-training evaluation once called the rewards itself, without
    `reward_timeout`, and a hanging reward hung the run.)"""
    import ast
    import pathlib

    import grpo_plugin

    root = pathlib.Path(grpo_plugin.__file__).parent
    reward_args = {"completions", "completion_ids"}
    offenders = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).as_posix() == "scoring/scorer.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Name | ast.Attribute) and "_score_completions" in ast.unparse(
                node
            ):
                offenders.append(f"{path.name}:{node.lineno} uses _score_completions")
            if not isinstance(node, ast.Call):
                continue
            called = ast.unparse(node.func).split(".")[-1]
            if called[:1].isupper() or called == "replace":  # building a Rollout, not a call
                continue
            keys = {k.arg for k in node.keywords}
            keys |= {
                key.value
                for k in node.keywords
                if k.arg is None and isinstance(k.value, ast.Dict)
                for key in k.value.keys
                if isinstance(key, ast.Constant)
            }
            if keys & reward_args:
                offenders.append(f"{path.name}:{node.lineno} calls {called} with reward arguments")
    assert offenders == []


@pytest.mark.parametrize("value", ["2", "0.5", b"1"])
def test_numeric_strings_are_refused_naming_the_function_and_sample(value):
    """TRL's `torch.tensor(rewards)` refuses text; `float("2")` would take it silently."""

    def as_text(completions, **kw):
        return [1.0, value]

    with pytest.raises(RewardFunctionError) as err:
        call([as_text], ["a", "b"])
    assert f"'as_text' returned {value!r} for sample 1; expected a float or None" in str(err.value)
    assert "\n" not in str(err.value)
