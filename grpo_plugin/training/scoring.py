"""Call the reward functions on a rollout and turn their answers into a reward matrix.

TRL's contract: `fn(prompts, completions, completion_ids, **columns) -> list[float | None]`.
Where we are stricter than TRL: a wrong-length answer is an error naming the function (TRL
broadcasts it silently), an exception is re-raised with the function's name and the sample index,
and `None` becomes NaN ("not scored"), which the advantage estimators leave out of the statistics.
`async def` rewards run concurrently with each other.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from reward_fns import is_async_reward, reward_name
from reward_fns.registry import run_awaitable

from ..rollout.types import Rollout


class RewardFunctionError(RuntimeError):
    """A reward function failed or broke the contract; the message names it."""


def _find_failing_index(fn: Callable, kwargs: dict[str, Any]) -> int | None:
    """Re-run a failing sync reward one sample at a time to name the sample that raises."""
    n = len(kwargs["completions"])
    for i in range(n):
        single = {
            k: [v[i]] if isinstance(v, list) and len(v) == n else v for k, v in kwargs.items()
        }
        try:
            fn(**single)
        except Exception:
            return i
    return None


def _run_sync(fn: Callable, kwargs: dict[str, Any]) -> Any:
    try:
        return fn(**kwargs)
    except Exception as err:
        index = _find_failing_index(fn, kwargs)
        where = f" on sample {index}" if index is not None else ""
        raise RewardFunctionError(
            f"reward function {reward_name(fn)!r} raised {type(err).__name__}{where}: {err}"
        ) from err


async def _gather_async(fns: list[Callable], kwargs: dict[str, Any]) -> list[Any]:
    async def one(fn: Callable) -> Any:
        try:
            return await fn(**kwargs)
        except Exception as err:
            raise RewardFunctionError(
                f"reward function {reward_name(fn)!r} raised {type(err).__name__}: {err}"
            ) from err

    return await asyncio.gather(*(one(fn) for fn in fns))


def _to_column(fn: Callable, values: Any, n: int) -> list[float]:
    name = reward_name(fn)
    if not isinstance(values, (list, tuple)) and not torch.is_tensor(values):
        raise RewardFunctionError(
            f"reward function {name!r} returned {type(values).__name__}; it must return a list "
            f"with one float (or None) per completion ({n})."
        )
    values = list(values.tolist() if torch.is_tensor(values) else values)
    if len(values) != n:
        raise RewardFunctionError(
            f"reward function {name!r} returned {len(values)} values for {n} completions; "
            "return exactly one float (or None for 'not scored') per completion."
        )
    out = []
    for i, v in enumerate(values):
        if v is None:
            out.append(math.nan)
            continue
        try:
            out.append(float(v))
        except (TypeError, ValueError) as err:
            raise RewardFunctionError(
                f"reward function {name!r} returned {v!r} for sample {i}; expected a float or None."
            ) from err
    return out


def score_completions(
    reward_funcs: Sequence[Callable],
    prompts: list[Any],
    completions: list[Any],
    completion_ids: list[list[int]],
    columns: dict[str, list[Any]],
) -> torch.Tensor:
    """Return per-function rewards, shape (N, F), NaN where a function did not score."""
    n = len(completions)
    kwargs = {"prompts": prompts, "completions": completions, "completion_ids": completion_ids}
    kwargs.update(columns)
    results: dict[int, Any] = {}
    async_idx = [i for i, fn in enumerate(reward_funcs) if is_async_reward(fn)]
    for i, fn in enumerate(reward_funcs):
        if i not in async_idx:
            results[i] = _run_sync(fn, kwargs)
    if async_idx:
        outs = run_awaitable(_gather_async([reward_funcs[i] for i in async_idx], kwargs))
        results.update(zip(async_idx, outs))
    matrix = [_to_column(reward_funcs[i], results[i], n) for i in range(len(reward_funcs))]
    return torch.tensor(matrix, dtype=torch.float32).T.reshape(n, len(reward_funcs))  # (N, F)


def combine_rewards(per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted sum over functions, ignoring NaN; NaN only where no function scored. (N, F) -> (N,)"""
    scored = ~torch.isnan(per_func)
    total = torch.where(scored, per_func, 0.0) @ weights
    return torch.where(scored.any(dim=1), total, torch.nan)


def score_rollout(
    rollout: Rollout, reward_funcs: Sequence[Callable], weights: torch.Tensor
) -> Rollout:
    """Fill `rollout.per_func` `(N, F)` and `rollout.rewards` `(N,)` (in place; returned too).
    With environments (`environment_factory`) every function also gets `environments` (N,), as
    in TRL."""
    columns = rollout.columns
    if rollout.environments is not None:
        columns = {**columns, "environments": rollout.environments}
    rollout.per_func = score_completions(
        reward_funcs, rollout.prompts, rollout.completions, rollout.completion_ids, columns
    )
    rollout.rewards = combine_rewards(rollout.per_func, weights)
    return rollout
