"""Tools the policy may call: their schemas, and running one round of calls for a batch of rows.

- `Tool.of(fn)`: a typed Python function (or an environment's bound method), sync or `async def`,
  with a Google-style docstring. Its JSON schema is transformers' `get_json_schema`, what
  `apply_chat_template(tools=...)` renders; it is built once, so a function without type hints
  or docstring fails when the trainer is built, not in the middle of a run.
- `run_calls`: every call of every row at once, each in its own thread (an `async def` tool on
  its own event loop, cancelled at the timeout), with `timeout` seconds for all. A call that
  raises (`SystemExit` too), times out, names an unknown tool, gets arguments its signature does
  not accept, or could not be parsed returns an `Error: ...` message to the model and is counted
  as failed; it never stops the run. Results are text (JSON for non-strings), cut to `max_chars`.

Where the calls run: the user's tools in the worker process of `isolation.py` (`isolate=True`,
`GRPOConfig.isolate_user_code`), so a call still running at the timeout is stopped whatever it
is doing, in C code too: the worker is killed, the round's unfinished calls time out, and the
next round forks a new worker. A tool that ends the worker (`os._exit`, a crash) fails its call
the same way. Tools marked `in_process` run here: an environment's methods (the environment's
state is the trainer's: TRL's `trainer.environments`, `get_reward`) and the built-in `python`
tool (it runs code in a killed-at-timeout sandbox process of its own). A call here that ignores
its timeout keeps running in its daemon thread (Python cannot stop a thread) while the run goes on
without its result; one that holds the interpreter lock in C code ends the process
`HARD_STOP_GRACE_S` after the timeout (`isolation.in_process_limit`).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..user_code import worker as isolation
from .types import ToolCall, ToolResult

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tool:
    """A callable the model may call by `name`, with the JSON schema its prompt shows."""

    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]
    in_process: bool = False  # runs in the trainer's process, never in the worker (see above)

    @classmethod
    def of(cls, fn: Callable[..., Any]) -> Tool:
        """Build the schema now; a ValueError names the function and what its docstring lacks."""
        from transformers.utils import get_json_schema

        name = getattr(fn, "__name__", type(fn).__name__)
        try:
            schema = get_json_schema(fn)
        except Exception as err:
            raise ValueError(
                f"tool {name!r} cannot be described to the model: {err}. A tool needs type hints "
                "on every argument and a Google-style docstring with an Args: section."
            ) from err
        in_process = bool(getattr(fn, "runs_in_process", False))
        return cls(name=name, fn=fn, schema=schema, in_process=in_process)

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)


def toolbox(tools: Sequence[Tool]) -> dict[str, Tool]:
    """`{name: tool}`; two tools of one name are a ValueError (the model could not tell them apart)."""
    box: dict[str, Tool] = {}
    for tool in tools:
        if tool.name in box and box[tool.name].fn is not tool.fn:
            raise ValueError(f"two tools are named {tool.name!r}; give each tool its own name")
        box[tool.name] = tool
    return box


def as_text(value: Any, max_chars: int) -> str:
    """A tool's return value as the text the model reads, cut to `max_chars` characters."""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value)
        except (TypeError, ValueError):
            text = str(value)
    if len(text) > max_chars:
        text = f"{text[:max_chars]}... [{len(text) - max_chars} more characters]"
    return text


def _invoke(tool: Tool, arguments: dict[str, Any], timeout: float) -> Any:
    if tool.is_async:
        return asyncio.run(asyncio.wait_for(tool.fn(**arguments), timeout))
    return tool.fn(**arguments)


def _bad_arguments(tool: Tool, arguments: dict[str, Any]) -> str | None:
    try:
        inspect.signature(tool.fn).bind(**arguments)
    except TypeError as err:
        return f"bad arguments for {tool.name}: {err}"
    except ValueError:  # no signature to check (a builtin): let the call decide
        return None
    return None


def _prepare(call: ToolCall, box: dict[str, Tool]) -> Tool | str:
    """The tool to run, or the error the model gets instead."""
    if call.error is not None:
        return call.error
    if call.name not in box:
        known = ", ".join(sorted(box)) or "none"
        return f"there is no tool named {call.name!r} (tools: {known})"
    return _bad_arguments(box[call.name], call.arguments) or box[call.name]


Outcome = tuple[bool, Any]  # (succeeded, value) or (failed, the error the model reads)
Job = tuple[tuple[int, int], Tool, dict[str, Any]]  # ((row, call), tool, arguments)


def _call(tool: Tool, arguments: dict[str, Any], timeout: float) -> Outcome:
    try:
        return True, _invoke(tool, arguments, timeout)
    except asyncio.TimeoutError:
        return False, f"{tool.name} timed out after {timeout:g} s"
    except (Exception, SystemExit) as err:  # the model is told; the run goes on
        return False, f"{tool.name} raised {type(err).__name__}: {err}"


def _start(jobs: list[Job], timeout: float, max_chars: int, done: Callable) -> list:
    """A daemon thread per job; each calls `done(key, outcome)` (a result as text) as it ends."""
    threads = []
    for key, tool, arguments in jobs:

        def work(key=key, tool=tool, arguments=arguments) -> None:
            ok, value = _call(tool, arguments, timeout)
            done(key, (ok, as_text(value, max_chars) if ok else value))

        thread = threading.Thread(target=work, daemon=True, name=f"tool-{tool.name}")
        thread.start()
        threads.append((key, tool.name, thread))
    return threads


def _join(threads: list, deadline: float, timeout: float) -> dict:
    """The calls still running at `deadline`, failed (whatever they return later is ignored)."""
    late = {}
    for key, name, thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            late[key] = (False, f"{name} timed out after {timeout:g} s")
    return late


def _worker_round(targets: tuple, payload: tuple, emit: Callable) -> None:
    """In the worker: every call at once, each outcome sent back as it ends."""
    calls, timeout, max_chars = payload
    jobs = [(key, targets[t], arguments) for key, t, arguments in calls]
    for _, _, thread in _start(jobs, timeout, max_chars, lambda *outcome: emit(outcome)):
        thread.join()


def _in_worker(jobs: list[Job], timeout: float, max_chars: int) -> dict:
    """The outcomes of `jobs`, run in the worker; a call unfinished at the timeout (the worker
    then killed) or when the worker ended by itself fails with the reason."""
    tools = list({id(tool): tool for _, tool, _ in jobs}.values())
    index = {id(tool): t for t, tool in enumerate(tools)}
    calls = [(key, index[id(tool)], arguments) for key, tool, arguments in jobs]
    worker = isolation.shared_worker()
    reply = worker.run(_worker_round, tuple(tools), (calls, timeout, max_chars), timeout)
    outcomes = dict(reply.parts)
    for key, tool, _ in jobs:
        if key in outcomes:
            continue
        if reply.timed_out:
            outcomes[key] = (False, f"{tool.name} timed out after {timeout:g} s")
        elif reply.lost is not None:
            outcomes[key] = (False, f"{tool.name} ended its worker process ({reply.lost})")
        else:
            why = f"{type(reply.error).__name__}: {reply.error}"
            outcomes[key] = (False, f"{tool.name} could not run in the worker process ({why})")
    if reply.timed_out or reply.lost or reply.error:
        late = sorted({t.name for k, t, _ in jobs if not outcomes[k][0]})
        what = "ran past tool_timeout" if reply.timed_out else "ended the worker process"
        logger.warning("tool call(s) of %s %s; a new worker serves the next round", late, what)
    return outcomes


def run_calls(
    calls: Sequence[Sequence[ToolCall]],
    boxes: Sequence[dict[str, Tool]],
    *,
    timeout: float,
    max_chars: int,
    isolate: bool = True,
) -> list[list[ToolResult]]:
    """Run `calls[r]` with the tools of `boxes[r]` for every row r at once; the results in order.
    With `isolate`, tools not marked `in_process` run in the worker process."""
    jobs = [(r, i, call) for r, row in enumerate(calls) for i, call in enumerate(row)]
    outcomes: dict[tuple[int, int], Outcome] = {}
    here: list[Job] = []
    there: list[Job] = []
    for r, i, call in jobs:
        target = _prepare(call, boxes[r])
        if isinstance(target, str):
            outcomes[r, i] = (False, target)
            continue
        isolated = isolate and isolation.supported() and not target.in_process
        (there if isolated else here).append(((r, i), target, call.arguments))
    deadline = time.monotonic() + timeout
    with isolation.in_process_limit(timeout if here else None):
        threads = _start(here, timeout, max_chars, outcomes.__setitem__)
        if there:
            outcomes.update(_in_worker(there, timeout, max_chars))
        late = _join(threads, deadline, timeout)
    final = {**outcomes, **late}  # a late thread's answer, if it comes, is not read
    results: list[list[ToolResult]] = [[] for _ in calls]
    for r, i, call in jobs:
        ok, value = final[r, i]
        content = value if ok else f"Error: {value}"
        results[r].append(ToolResult(name=call.name or "tool", content=content, failed=not ok))
    return results
