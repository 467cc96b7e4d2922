"""Call the reward functions on a rollout and turn their answers into a reward matrix.

TRL's contract: `fn(prompts, completions, completion_ids, **columns) -> list[float | None]`.
Where we are stricter than TRL: a wrong-length answer is an error naming the function (TRL
broadcasts it silently), an exception is re-raised with the function's name and the sample index,
and `None` becomes NaN ("not scored"), which the advantage estimators leave out of the statistics.
A value that is not a finite number within float32's range (inf, -inf, 1e39, and NaN unless
`RewardChecks.nan_as_unscored`) is an error naming the function and the sample: such a value
would zero its group or turn every weight into NaN. Lists, tuples, tensors and numpy arrays of
floats, ints, bools or numpy scalars are accepted; a string (even "2") is refused, as TRL's
`torch.tensor` refuses it. A call that runs past `RewardChecks.timeout`
seconds is an error naming the function (`watchdog.py`). `async def` rewards run concurrently
with each other.

`RewardScorer` is the one way the package calls reward functions: training, overlapped scoring,
evaluation during training, the recipe's before/after evaluation and `grpo-plugin eval` all score
through it, so the run's checks (`reward_timeout`, non-finite values, names in errors) hold
everywhere. It has no default checks: whoever builds one says which apply.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from reward_fns import is_async_reward, reward_name
from reward_fns.registry import run_awaitable

from ...rollout.types import Rollout
from .watchdog import CallTimeout, time_limit

FLOAT32_MAX = float(torch.finfo(torch.float32).max)


class RewardFunctionError(RuntimeError):
    """A reward function failed or broke the contract; the message names it."""


@dataclass(frozen=True)
class RewardChecks:
    """How strictly reward answers are taken (`GRPOConfig.reward_timeout`,
    `GRPOConfig.nan_rewards_as_unscored`)."""

    timeout: float | None = None  # seconds per call; None: no limit
    nan_as_unscored: bool = False  # NaN means "not scored" (like None) instead of an error

    @classmethod
    def from_args(cls, args: Any) -> RewardChecks:
        """The checks a `GRPOConfig` asks for."""
        return cls(args.reward_timeout, args.nan_rewards_as_unscored)


def _timed_out(fn: Callable, err: CallTimeout) -> RewardFunctionError:
    return RewardFunctionError(
        f"reward function {reward_name(fn)!r} timed out: {err}; make it faster or raise "
        "reward_timeout (None: no limit)."
    )


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


def _run_sync(fn: Callable, kwargs: dict[str, Any], timeout: float | None) -> Any:
    what = f"reward function {reward_name(fn)!r}"
    try:
        with time_limit(timeout, "it"):  # "it did not return within ... s"
            try:
                return fn(**kwargs)
            except Exception as err:
                index = _find_failing_index(fn, kwargs)
                where = f" on sample {index}" if index is not None else ""
                raise RewardFunctionError(
                    f"{what} raised {type(err).__name__}{where}: {err}"
                ) from err
    except CallTimeout as err:
        raise _timed_out(fn, err) from None


async def _gather_async(
    fns: list[Callable], kwargs: dict[str, Any], timeout: float | None
) -> list[Any]:
    async def one(fn: Callable) -> Any:
        try:
            return await asyncio.wait_for(fn(**kwargs), timeout)
        except asyncio.TimeoutError:
            raise _timed_out(fn, CallTimeout(f"it did not return within {timeout:g} s")) from None
        except Exception as err:
            raise RewardFunctionError(
                f"reward function {reward_name(fn)!r} raised {type(err).__name__}: {err}"
            ) from err

    return await asyncio.gather(*(one(fn) for fn in fns))


def _check_value(name: str, value: Any, index: int, checks: RewardChecks) -> float:
    """One reward as a float (NaN = not scored), or RewardFunctionError naming the sample."""
    if value is None:
        return math.nan
    try:
        if isinstance(value, (str, bytes, bytearray)):  # "2" is text, not a score (TRL's
            raise TypeError  # torch.tensor refuses it too); float() would take it silently
        out = float(value)
    except (TypeError, ValueError, OverflowError) as err:
        raise RewardFunctionError(
            f"reward function {name!r} returned {value!r} for sample {index}; expected a float or "
            "None."
        ) from err
    if math.isnan(out):
        if checks.nan_as_unscored:
            return math.nan
        raise RewardFunctionError(
            f"reward function {name!r} returned NaN for sample {index}; return None for 'not "
            "scored' (or set nan_rewards_as_unscored=True to read NaN that way)."
        )
    if not abs(out) <= FLOAT32_MAX:
        raise RewardFunctionError(
            f"reward function {name!r} returned {value!r} for sample {index}; rewards must be "
            f"finite numbers within float32's range (|r| <= {FLOAT32_MAX:.3g})."
        )
    return out


def _to_column(fn: Callable, values: Any, n: int, checks: RewardChecks) -> list[float]:
    name = reward_name(fn)
    if hasattr(values, "tolist") and not isinstance(values, (list, tuple)):
        values = values.tolist()  # a tensor or a numpy array
    if not isinstance(values, (list, tuple)):
        raise RewardFunctionError(
            f"reward function {name!r} returned {type(values).__name__}; it must return a list "
            f"with one float (or None) per completion ({n})."
        )
    values = list(values)
    if len(values) != n:
        raise RewardFunctionError(
            f"reward function {name!r} returned {len(values)} values for {n} completions; "
            "return exactly one float (or None for 'not scored') per completion."
        )
    return [_check_value(name, v, i, checks) for i, v in enumerate(values)]


def _score_completions(
    reward_funcs: Sequence[Callable],
    prompts: list[Any],
    completions: list[Any],
    completion_ids: list[list[int]],
    columns: dict[str, list[Any]],
    checks: RewardChecks,
) -> torch.Tensor:
    """Return per-function rewards, shape (N, F), NaN where a function did not score."""
    n = len(completions)
    kwargs = {"prompts": prompts, "completions": completions, "completion_ids": completion_ids}
    kwargs.update(columns)
    results: dict[int, Any] = {}
    async_idx = [i for i, fn in enumerate(reward_funcs) if is_async_reward(fn)]
    for i, fn in enumerate(reward_funcs):
        if i not in async_idx:
            results[i] = _run_sync(fn, kwargs, checks.timeout)
    if async_idx:
        fns = [reward_funcs[i] for i in async_idx]
        outs = _run_async(fns, kwargs, checks.timeout)
        results.update(zip(async_idx, outs))
    matrix = [_to_column(reward_funcs[i], results[i], n, checks) for i in range(len(reward_funcs))]
    return torch.tensor(matrix, dtype=torch.float32).T.reshape(n, len(reward_funcs))  # (N, F)


def _run_async(fns: list[Callable], kwargs: dict[str, Any], timeout: float | None) -> list[Any]:
    """The async rewards, concurrently; each under `timeout`, and the whole under a little more
    (a coroutine that blocks the event loop cannot be cancelled by `wait_for`)."""
    names = ", ".join(repr(reward_name(fn)) for fn in fns)
    try:
        with time_limit(timeout and timeout + 1.0, f"async reward function(s) {names}"):
            return run_awaitable(_gather_async(fns, kwargs, timeout))
    except CallTimeout as err:
        raise RewardFunctionError(
            f"{err}; an async reward must not block the event loop (use await), or raise "
            "reward_timeout."
        ) from None


def combine_rewards(per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted sum over functions, ignoring NaN; NaN only where no function scored. (N, F) -> (N,)"""
    scored = ~torch.isnan(per_func)
    total = torch.where(scored, per_func, 0.0) @ weights
    return torch.where(scored.any(dim=1), total, torch.nan)


@dataclass(frozen=True)
class RewardScorer:
    """Reward functions, their weights and the checks their answers get: the one scorer."""

    funcs: tuple[Callable, ...]
    weights: torch.Tensor  # (F,)
    checks: RewardChecks

    def first(self) -> RewardScorer:
        """The first function alone, weight 1 (held-out accuracy is read from it)."""
        return RewardScorer(self.funcs[:1], torch.ones(1), self.checks)

    def score_columns(
        self, prompts: list[Any], completions: list[Any], completion_ids: list, columns: dict
    ) -> torch.Tensor:
        """Per-function rewards `(N, F)`, NaN where a function did not score."""
        return _score_completions(
            self.funcs, prompts, completions, completion_ids, columns, self.checks
        )

    def score(self, rollout: Rollout) -> Rollout:
        """Fill `rollout.per_func` `(N, F)` and `rollout.rewards` `(N,)` (in place; returned too).
        With environments (`environment_factory`) every function also gets `environments` (N,),
        as in TRL."""
        r = rollout
        columns = (
            r.columns if r.environments is None else {**r.columns, "environments": r.environments}
        )
        r.per_func = self.score_columns(r.prompts, r.completions, r.completion_ids, columns)
        r.rewards = combine_rewards(r.per_func, self.weights)
        return r
