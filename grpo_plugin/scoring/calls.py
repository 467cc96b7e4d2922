"""Calling the reward functions: in a worker process that a time limit can kill, or here.

Where a function runs:
- **the user's functions**: in the worker process of `user_code/worker.py` (with
  `isolate_user_code`, the default). `reward_timeout` then stops any call, one stuck in C code
  too (the worker is killed), and a function that ends its process (`sys.exit`, `os._exit`, a
  crash) is an error naming it;
- **here**, in the trainer's process: reward models (our forward, on the trainer's device), the
  built-in rewards of `reward_fns` (each bounded: linear-time scans, or a killable process of its
  own for `math` and `code_tests`), functions marked `reward_fns.in_process`, and every reward of
  a run with environments (they receive the environments, whose state is the trainer's). A signal
  interrupts a call here that runs Python past `reward_timeout` (`watchdog.py`); one stuck in C
  code ends the process `HARD_STOP_GRACE_S` later (`isolation.in_process_limit`).

Either way the contract is the same: an exception comes back as `RewardFunctionError` naming the
function and the sample that raises (the batch is re-run one sample at a time to find it; the
original traceback is its cause); the answer is checked (`checks.to_column`); `trainer_state`,
`log_extra` and `log_metric` reach the functions that declare them (`context.py`). In the worker,
`trainer_state` is the trainer's at the call, and what a function logs comes back with its
answer. `async def` rewards run concurrently with each other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from reward_fns import reward_name, runs_in_process
from reward_fns.registry import run_awaitable

from ..user_code import worker as isolation
from .answer_checks import RewardChecks, RewardFunctionError, to_column
from .context import RewardContext, declared_trainer_kwargs
from .watchdog import CallTimeout, time_limit

ASYNC_GRACE_S = 1.0  # the async rewards together: their timeout plus this (a blocked event loop)


def in_worker(fn: Callable, checks: RewardChecks, kwargs: dict | None = None) -> bool:
    """Whether `fn` runs in the worker process (see the module docstring). Not with
    `environments` among its arguments: their state is the trainer's, so they are read here."""
    if kwargs is not None and "environments" in kwargs:
        return False
    return checks.isolate and isolation.supported() and not runs_in_process(fn)


def worker_targets(funcs: list[Callable], checks: RewardChecks) -> list[Callable]:
    """The functions of `funcs` that run in the worker process (for `isolation.prepare`)."""
    return [fn for fn in funcs if in_worker(fn, checks)]


def _timed_out(fn: Callable, timeout: float | None) -> RewardFunctionError:
    return RewardFunctionError(
        f"reward function {reward_name(fn)!r} timed out: it did not return within {timeout:g} s; "
        "make it faster or raise reward_timeout (None: no limit)."
    )


def _lost(names: str, how: str) -> RewardFunctionError:
    if how.startswith(isolation.OUT_OF_MEMORY):  # not an exit: "never exit" would mislead
        return RewardFunctionError(
            f"reward function {names} ended its worker process ({how}); make it use less "
            "memory (it scores a step's completions in one call), or give the run more."
        )
    return RewardFunctionError(
        f"reward function {names} ended its worker process ({how}) instead of returning; a "
        "reward must return one float (or None) per completion, never exit."
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
        except (Exception, SystemExit):
            return i
    return None


def _call_naming_failure(fn: Callable, kwargs: dict[str, Any]) -> Any:
    """`fn(**kwargs)`; what it raises (`SystemExit` too) as RewardFunctionError naming it and
    the sample."""
    try:
        return fn(**kwargs)
    except (Exception, SystemExit) as err:  # not Ctrl-C, a time limit or a stop on a signal
        index = _find_failing_index(fn, kwargs)
        where = f" on sample {index}" if index is not None else ""
        hint = (
            "; a reward must return its scores, never exit" if isinstance(err, SystemExit) else ""
        )
        raise RewardFunctionError(
            f"reward function {reward_name(fn)!r} raised {type(err).__name__}{where}: {err}{hint}"
        ) from err


def _trainer_kwargs(fn: Callable, context: RewardContext | None) -> dict[str, Any]:
    return context.trainer_kwargs(fn) if context is not None else {}


# --- sync: one function at a time ------------------------------------------------------------
def _sync_here(fn: Callable, kwargs: dict, checks: RewardChecks, context) -> list[float]:
    try:
        with isolation.in_process_limit(checks.timeout), time_limit(checks.timeout, "it"):
            values = _call_naming_failure(fn, {**kwargs, **_trainer_kwargs(fn, context)})
    except CallTimeout:
        raise _timed_out(fn, checks.timeout) from None
    return to_column(fn, values, len(kwargs["completions"]), checks)


def _sync_job(targets: tuple, payload: tuple, emit: Callable) -> tuple:
    """In the worker: one sync reward's checked column and what it logged."""
    (fn,), (kwargs, checks, state) = targets, payload
    local = RewardContext(lambda: state)
    values = _call_naming_failure(fn, {**kwargs, **local.trainer_kwargs(fn)})
    return to_column(fn, values, len(kwargs["completions"]), checks), local.pop_raw()


def _live_state(fns: list[Callable], context: RewardContext | None) -> Any:
    """The trainer's state, for the worker, when one of `fns` declares `trainer_state`."""
    wanted = context is not None and any("trainer_state" in declared_trainer_kwargs(f) for f in fns)
    return context.state() if wanted else None


def _in_worker(job: Callable, fns: list, payload: tuple, timeout, context) -> list:
    names = ", ".join(repr(reward_name(f)) for f in fns)
    reply = isolation.shared_worker().run(job, tuple(fns), payload, timeout)
    if reply.timed_out:
        if len(fns) == 1:
            raise _timed_out(fns[0], timeout)
        raise RewardFunctionError(
            f"async reward function(s) {names} did not return within {timeout:g} s; make them "
            "faster or raise reward_timeout (None: no limit)."
        )
    if reply.lost is not None:
        raise _lost(names, reply.lost)
    if reply.error is not None and not isinstance(reply.error, RewardFunctionError):
        raise RewardFunctionError(
            f"reward function {names} could not run in the worker process: {reply.error}; mark "
            "it reward_fns.in_process, or set isolate_user_code=False."
        ) from reply.error
    answer, logged = reply.value()
    if context is not None:
        context.absorb(*logged)
    return answer


def call_sync(fn: Callable, kwargs: dict, checks: RewardChecks, context) -> list[float]:
    """One sync reward's checked column for the completions in `kwargs`."""
    if not in_worker(fn, checks, kwargs):
        return _sync_here(fn, kwargs, checks, context)
    payload = (kwargs, checks, _live_state([fn], context))
    return _in_worker(_sync_job, [fn], payload, checks.timeout, context)


# --- async: the functions concurrently -------------------------------------------------------
async def _gather(fns: list, kwargs: dict, timeout: float | None, context) -> list[Any]:
    async def one(fn: Callable) -> Any:
        try:
            call = fn(**kwargs, **_trainer_kwargs(fn, context))
            return await asyncio.wait_for(call, timeout)
        except asyncio.TimeoutError:
            raise _timed_out(fn, timeout) from None
        except Exception as err:
            raise RewardFunctionError(
                f"reward function {reward_name(fn)!r} raised {type(err).__name__}: {err}"
            ) from err

    return await asyncio.gather(*(one(fn) for fn in fns))


def _columns(fns: list, answers: list, kwargs: dict, checks: RewardChecks) -> list[list[float]]:
    return [to_column(f, a, len(kwargs["completions"]), checks) for f, a in zip(fns, answers)]


def _async_here(fns: list, kwargs: dict, checks: RewardChecks, context) -> list[list[float]]:
    names = ", ".join(repr(reward_name(fn)) for fn in fns)
    limit = checks.timeout and checks.timeout + ASYNC_GRACE_S
    try:
        with isolation.in_process_limit(limit), time_limit(limit, f"async reward(s) {names}"):
            answers = run_awaitable(_gather(fns, kwargs, checks.timeout, context))
    except CallTimeout as err:
        raise RewardFunctionError(
            f"{err}; an async reward must not block the event loop (use await), or raise "
            "reward_timeout."
        ) from None
    return _columns(fns, answers, kwargs, checks)


def _async_job(targets: tuple, payload: tuple, emit: Callable) -> tuple:
    """In the worker: the async rewards' checked columns and what they logged."""
    fns, (kwargs, checks, state) = list(targets), payload
    local = RewardContext(lambda: state)
    answers = run_awaitable(_gather(fns, kwargs, checks.timeout, local))
    return _columns(fns, answers, kwargs, checks), local.pop_raw()


def call_async(fns: list, kwargs: dict, checks: RewardChecks, context) -> list[list[float]]:
    """The async rewards' checked columns, in `fns` order: the user's together in the worker,
    the others together here."""
    there = [f for f in fns if in_worker(f, checks, kwargs)]
    here = [f for f in fns if not in_worker(f, checks, kwargs)]
    out = dict(zip(map(id, here), _async_here(here, kwargs, checks, context) if here else []))
    if there:
        limit = checks.timeout and checks.timeout + ASYNC_GRACE_S
        payload = (kwargs, checks, _live_state(there, context))
        out.update(zip(map(id, there), _in_worker(_async_job, there, payload, limit, context)))
    return [out[id(f)] for f in fns]
