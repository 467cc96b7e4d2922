"""The built-in `python` tool: the model's code runs in the `code_tests` sandbox.

`tools: [python]` in a recipe (or `GRPOTrainer(tools=["python"])`) gives the model a
`python(code)` tool that returns what the program prints. The code runs exactly where
`code_tests` runs generated code (`reward_fns.sandbox`): a fresh process tree with a minimal root
where the machine allows one (interpreter and stdlib only, no project files), no network, limits
on time, memory, processes and output, and an environment holding `PATH` and little else. A
program that fails returns the end of its traceback; one that runs out of time says so. The
sandbox's own timeout is below `tool_timeout`, so the process is killed, not abandoned.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from reward_fns.sandbox import SandboxLimits, run_python

TRACEBACK_LINES = 8  # of a failing program's stderr, the lines the model reads


def make_python_tool(
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    isolation: str = "auto",
    packages: Sequence[str] = (),
) -> Callable[[str], str]:
    """A `python(code) -> str` tool with these sandbox limits (`reward_fns.sandbox`)."""
    limits = SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb, max_output_bytes=1 << 16)

    def python(code: str) -> str:
        """Run a Python program and return what it prints.

        Args:
            code: The Python source to run; print() the values you want to see.
        """
        run = run_python(code, limits=limits, isolation=isolation, packages=tuple(packages))
        if run.timed_out:
            return f"Error: the program did not finish within {timeout_s:g} s"
        output = run.stdout.rstrip()
        if run.returncode != 0:
            tail = "\n".join(run.stderr.strip().splitlines()[-TRACEBACK_LINES:])
            output += f"\nError (exit code {run.returncode}):\n{tail}"
        return output.strip() or "(the program printed nothing)"

    python.runs_in_process = True  # its own sandbox process, killed at its timeout
    return python


python = make_python_tool()
