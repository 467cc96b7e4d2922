"""Tool schemas and one round of calls: order, concurrency, timeouts, cut results."""

from __future__ import annotations

import threading
import time

import pytest

from grpo_plugin.rollout.environments import Environments, with_observation
from grpo_plugin.rollout.tools import Tool, as_text, run_calls, toolbox
from grpo_plugin.rollout.types import ToolCall


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def nap(seconds: float) -> str:
    """Sleep, then answer.

    Args:
        seconds: How long to sleep.
    """
    time.sleep(seconds)
    return "awake"


def test_a_tool_needs_type_hints_and_a_docstring():
    assert Tool.of(add).schema["function"]["parameters"]["required"] == ["a", "b"]

    def undocumented(a: int) -> int:
        return a

    with pytest.raises(ValueError, match="tool 'undocumented' cannot be described to the model"):
        Tool.of(undocumented)
    with pytest.raises(ValueError, match="two tools are named 'add'"):
        toolbox([Tool.of(add), Tool("add", len, {})])


def test_results_come_back_in_order_and_calls_run_at_once():
    four = threading.Barrier(4, timeout=4.0)  # passes only if the 4 calls wait on it together

    def meet(seconds: float) -> str:
        """Wait for the other calls, then answer.

        Args:
            seconds: Unused.
        """
        four.wait()
        return "awake"

    box = toolbox([Tool.of(add), Tool.of(meet)])
    calls = [[ToolCall("meet", {"seconds": 0.3}), ToolCall("add", {"a": 1, "b": 2})],
             [ToolCall("meet", {"seconds": 0.3})] * 3]  # fmt: skip
    results = run_calls(calls, [box, box], timeout=5.0, max_chars=100)
    assert [[r.content for r in row] for row in results] == [["awake", "3"], ["awake"] * 3]
    assert not any(r.failed for row in results for r in row)


def test_a_late_call_times_out_and_long_results_are_cut():
    box = toolbox([Tool.of(nap)])
    ((late,),) = run_calls([[ToolCall("nap", {"seconds": 3})]], [box], timeout=0.2, max_chars=100)
    assert late.failed and late.content == "Error: nap timed out after 0.2 s"
    assert as_text("x" * 12, 5) == "xxxxx... [7 more characters]"
    assert as_text({"a": [1, 2]}, 100) == '{"a": [1, 2]}'
    assert as_text(object, 100).startswith("<class")


class NoReset:
    def act(self, x: int) -> int:
        """Act.

        Args:
            x: A number.
        """
        return x


class Probe:
    made = 0

    def __init__(self):
        Probe.made += 1

    def reset(self, **row):
        return None

    def act(self, x: int) -> int:
        """Act.

        Args:
            x: A number.
        """
        return x

    def _private(self):
        return None


def test_environments_are_probed_pooled_and_checked():
    with pytest.raises(ValueError, match="the environment NoReset has no reset"):
        Environments(NoReset)
    Probe.made = 0
    envs = Environments(Probe)
    assert Probe.made == 1 and [t.name for t in envs.tools_of(envs.pool[None][0])] == ["act"]
    first = envs.checkout([{}] * 3)
    assert Probe.made == 3 and len({id(e) for e in first}) == 3  # the probe is reused
    again = envs.checkout([{}] * 2)
    assert Probe.made == 3 and again == first[:2]  # pooled across rollouts
    prompt = [{"role": "user", "content": "Go"}]
    assert (
        with_observation(prompt, " now")[-1]["content"] == "Go now" and prompt[0]["content"] == "Go"
    )
