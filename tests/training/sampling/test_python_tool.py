"""The built-in `python` tool runs code in the code_tests sandbox."""

from __future__ import annotations

from grpo_plugin.training.sampling.python_tool import make_python_tool, python
from grpo_plugin.training.sampling.tool_inputs import resolve_tool


def test_it_returns_what_the_program_prints():
    assert python("print(6 * 7)") == "42"
    assert python("x = 1") == "(the program printed nothing)"
    assert resolve_tool("python") is python


def test_a_failing_program_returns_its_traceback():
    out = python("print('before')\n1 / 0")
    assert out.startswith("before\nError (exit code 1):") and "ZeroDivisionError" in out


def test_time_network_and_environment_are_limited():
    assert make_python_tool(timeout_s=1.0)("while True: pass") == (
        "Error: the program did not finish within 1 s"
    )
    net = python(
        "import socket\ntry:\n    socket.create_connection(('127.0.0.1', 22), timeout=1)\n"
        "    print('connected')\nexcept OSError as e:\n    print('blocked')"
    )
    assert net == "blocked"
    env = python("import os\nprint(' '.join(sorted(os.environ)))").split()
    assert set(env) <= {"HOME", "LANG", "LD_LIBRARY_PATH", "PATH", "PWD", "TMPDIR"}  # scrubbed
