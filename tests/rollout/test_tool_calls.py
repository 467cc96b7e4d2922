"""Tool schemas and one round of calls: order, concurrency, timeouts, cut results; the user's
tools in a worker process that a time limit can kill, environments' in this process."""

from __future__ import annotations

import os
import re
import threading
import time

import pytest

from grpo_plugin.rollout.environments import Environments, with_observation
from grpo_plugin.rollout.tool_calls import Tool, as_text, run_calls, toolbox
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


@pytest.mark.parametrize("isolate", [True, False], ids=["worker", "in-process"])
def test_a_late_call_times_out_and_long_results_are_cut(isolate):
    box = toolbox([Tool.of(nap)])
    ((late,),) = run_calls([[ToolCall("nap", {"seconds": 3})]], [box], timeout=0.2, max_chars=100,
                           isolate=isolate)  # fmt: skip
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


def backtrack(text: str) -> str:
    """Match a pattern that backtracks for ever on some texts.

    Args:
        text: The text to match.
    """
    return str(re.match(r"(a+)+$", text) is not None)


def quits(code: int) -> str:
    """End the process.

    Args:
        code: The exit code.
    """
    os._exit(code)


def exits(code: int) -> str:
    """Raise SystemExit.

    Args:
        code: The exit code.
    """
    raise SystemExit(code)


def test_a_tool_stuck_in_c_code_times_out_and_the_next_round_gets_a_new_worker(caplog):
    box = toolbox([Tool.of(backtrack), Tool.of(add)])
    stuck = [[ToolCall("backtrack", {"text": "a" * 60 + "b"})]]
    ((late,),) = run_calls(stuck, [box], timeout=1.0, max_chars=100)
    assert late.failed and late.content == "Error: backtrack timed out after 1 s"
    assert "['backtrack'] ran past tool_timeout" in caplog.text
    ((fine, three),) = run_calls([[ToolCall("backtrack", {"text": "aa"}), ToolCall("add", {"a": 1, "b": 2})]],
                                 [box], timeout=5.0, max_chars=100)  # fmt: skip
    assert (fine.content, three.content) == ("True", "3") and not fine.failed


def test_a_tool_that_exits_fails_its_call_and_the_run_goes_on():
    box = toolbox([Tool.of(quits), Tool.of(exits), Tool.of(add)])
    ((gone,), (raised,)) = run_calls([[ToolCall("quits", {"code": 3})], [ToolCall("exits", {"code": 4})]],
                                     [box, box], timeout=5.0, max_chars=100)  # fmt: skip
    assert gone.failed and gone.content == "Error: quits ended its worker process (exit code 3)"
    assert raised.failed and raised.content in (
        "Error: exits raised SystemExit: 4",  # it ran first, or alone
        "Error: exits ended its worker process (exit code 3)",  # its neighbour ended the worker
    )
    ((three,),) = run_calls(
        [[ToolCall("add", {"a": 1, "b": 2})]], [box], timeout=5.0, max_chars=100
    )
    assert three.content == "3"


class Counter:
    def reset(self, **row):
        self.count = 0

    def bump(self, by: int) -> int:
        """Add to the count.

        Args:
            by: How much.
        """
        self.count += by
        return self.count


def test_environment_tools_run_in_this_process_and_keep_its_state():
    envs = Environments(Counter)
    (env,) = envs.checkout([{}])
    Environments.reset(env, {}, False)
    box = toolbox(envs.tools_of(env))
    assert all(tool.in_process for tool in box.values())
    for expected in ("2", "5"):
        ((result,),) = run_calls([[ToolCall("bump", {"by": int(expected) - env.count})]], [box],
                                 timeout=5.0, max_chars=100)  # fmt: skip
        assert result.content == expected
    assert env.count == 5  # the trainer's own instance: TRL's `trainer.environments`
