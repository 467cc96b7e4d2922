"""Tools the policy may call: their schemas, and running one round of calls for a batch of rows.

- `Tool.of(fn)`: a typed Python function (or an environment's bound method), sync or `async def`,
  with a Google-style docstring. Its JSON schema is transformers' `get_json_schema`, what
  `apply_chat_template(tools=...)` renders; it is built once, so a function without type hints
  or docstring fails when the trainer is built, not in the middle of a run.
- `run_calls`: every call of every row at once, each in its own daemon thread (an `async def`
  tool on its own event loop, cancelled at the timeout), with `timeout` seconds for all. A call
  that raises, times out, names an unknown tool, gets arguments its signature does not accept, or
  could not be parsed returns an `Error: ...` message to the model and is counted as failed; it
  never stops the run. Results are text (JSON for non-strings), cut to `max_chars`.

A sync tool that ignores its timeout keeps running in its (daemon) thread: Python cannot stop a
thread, so the run goes on without its result and the thread dies with the process. The built-in
`python` tool runs code in a separate, killed-at-timeout sandbox process instead.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .types import ToolCall, ToolResult


@dataclass(frozen=True)
class Tool:
    """A callable the model may call by `name`, with the JSON schema its prompt shows."""

    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]

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
        return cls(name=name, fn=fn, schema=schema)

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


def run_calls(
    calls: Sequence[Sequence[ToolCall]],
    boxes: Sequence[dict[str, Tool]],
    *,
    timeout: float,
    max_chars: int,
) -> list[list[ToolResult]]:
    """Run `calls[r]` with the tools of `boxes[r]` for every row r at once; the results in order."""
    jobs = [(r, i, call) for r, row in enumerate(calls) for i, call in enumerate(row)]
    outcomes: dict[tuple[int, int], tuple[bool, Any]] = {}
    threads = []
    for r, i, call in jobs:
        target = _prepare(call, boxes[r])
        if isinstance(target, str):
            outcomes[r, i] = (False, target)
            continue

        def work(key=(r, i), tool=target, arguments=call.arguments) -> None:
            try:
                outcomes[key] = (True, _invoke(tool, arguments, timeout))
            except asyncio.TimeoutError:
                outcomes[key] = (False, f"{tool.name} timed out after {timeout:g} s")
            except Exception as err:  # the model is told; the run goes on
                outcomes[key] = (False, f"{tool.name} raised {type(err).__name__}: {err}")

        thread = threading.Thread(target=work, daemon=True, name=f"tool-{target.name}")
        thread.start()
        threads.append((r, i, target.name, thread))
    deadline = time.monotonic() + timeout
    late = {}
    for r, i, name, thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():  # still running: whatever it returns later is ignored
            late[r, i] = (False, f"{name} timed out after {timeout:g} s")
    results: list[list[ToolResult]] = [[] for _ in calls]
    for r, i, call in jobs:
        ok, value = late.get((r, i)) or outcomes[r, i]
        content = as_text(value, max_chars) if ok else f"Error: {value}"
        results[r].append(ToolResult(name=call.name or "tool", content=content, failed=not ok))
    return results
