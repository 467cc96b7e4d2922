"""``code_tests``: run the completion's Python code against the row's tests in a sandbox.

The code is the last fenced block of the completion (the whole text when there is none; an
unclosed final fence counts). The ``tests`` column is stdin/stdout cases (``[{"input",
"output"}]``, ``{"inputs": [...], "outputs": [...]}``, or either as JSON text) or a string of
Python statements run after the code, each ``assert`` being one test. The score is the fraction
of tests passed; a run that times out or crashes passes none of its tests; ``tests`` that
cannot be read score ``None``. Outputs are compared on **all** lines (trailing spaces and
blank lines ignored), not ``zip``-ed over a prefix as in open-r1's checker. Runs go through a
thread pool of ``2 * os.cpu_count()`` workers (sandbox start-up is partly latency, so 2x
oversubscription measured ~1.5x faster than one per core on the 2-core CI machine).

The sandbox itself (what is and is not isolated) is documented in ``reward_fns.sandbox``.
"""

from __future__ import annotations

import ast
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from reward_fns.registry import column, completion_text, register
from reward_fns.sandbox import SandboxLimits, run_python, sandbox_mode

_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)
_OPEN_FENCE = re.compile(r"```[^\n`]*\n")

_HARNESS = r"""
import ast, os, sys
fd = int(sys.argv[1])
code, tests = (open(p, encoding="utf-8").read() for p in sys.argv[2:4])
scope = {"__name__": "__main__", "__builtins__": __builtins__}
try:
    exec(compile(code, "solution.py", "exec"), scope)
except BaseException:
    pass  # tests still run on whatever was defined; exiting early earns nothing
body = ast.parse(tests).body
asserts = [isinstance(stmt, ast.Assert) for stmt in body]
results = []
for stmt in body:  # each assert is one test; other statements (imports, helpers) just run
    try:
        exec(compile(ast.Module([stmt], []), "tests.py", "exec"), scope)
        results.append(True)
    except BaseException:
        results.append(False)
passed = [ok for ok, is_assert in zip(results, asserts) if is_assert] if any(asserts) else [all(results)]
os.write(fd, b"".join(b"P\n" if ok else b"F\n" for ok in passed))
"""


def extract_code(text: str) -> str:
    """The last fenced code block; an unclosed final fence counts; else the whole text."""
    blocks = _FENCE.findall(text)
    last_open = list(_OPEN_FENCE.finditer(text))
    if last_open and text.count("```") % 2 == 1:  # truncated: the last fence never closes
        return text[last_open[-1].end() :]
    return blocks[-1] if blocks else text


def parse_tests(tests: Any) -> tuple[str, Any] | None:
    """``("io", [(stdin, stdout), ...])``, ``("asserts", (source, n_tests))`` or None."""
    if isinstance(tests, str) and tests.lstrip()[:1] in ("[", "{"):
        try:
            tests = json.loads(tests)
        except ValueError:
            pass
    if isinstance(tests, str):
        try:
            body = ast.parse(tests).body
        except SyntaxError:
            return None
        n_asserts = sum(isinstance(s, ast.Assert) for s in body)
        return ("asserts", (tests, n_asserts or 1)) if body else None
    if isinstance(tests, dict) and "inputs" in tests and "outputs" in tests:
        if len(tests["inputs"]) != len(tests["outputs"]):
            return None
        tests = [{"input": i, "output": o} for i, o in zip(tests["inputs"], tests["outputs"])]
    if isinstance(tests, list | tuple) and tests and all(isinstance(t, dict) for t in tests):
        if all("input" in t and "output" in t for t in tests):
            return "io", [(str(t["input"]), str(t["output"])) for t in tests]
    return None


def outputs_match(actual: str, expected: str) -> bool:
    """Every line equal after stripping trailing spaces; trailing blank lines ignored."""

    def lines(s: str) -> list[str]:
        return [line.rstrip() for line in s.rstrip().splitlines()]

    return lines(actual) == lines(expected)


def _run_case(code: str, case: tuple[str, str], limits: SandboxLimits, mode: str) -> float:
    stdin_text, expected = case
    result = run_python({"solution.py": code}, ["{dir}/solution.py"], stdin_text, limits, mode)
    ok = not result.timed_out and result.returncode == 0
    return float(ok and outputs_match(result.stdout, expected))


def _run_asserts(code: str, tests: str, limits: SandboxLimits, mode: str) -> list[float]:
    files = {"harness.py": _HARNESS, "solution.py": code, "tests.py": tests}
    args = ["{dir}/harness.py", "{fd}", "{dir}/solution.py", "{dir}/tests.py"]
    result = run_python(files, args, None, limits, mode)
    return [1.0 if line == "P" else 0.0 for line in result.results.split()]


def score_code(jobs: list[tuple[str, Any]], limits: SandboxLimits, workers: int, mode: str):
    """Fraction of tests passed per (code, parsed_tests) job; None where tests is None."""
    tasks: list[tuple[int, Any]] = []
    totals: list[int | None] = []
    for i, (code, parsed) in enumerate(jobs):
        if parsed is None:
            totals.append(None)
        elif parsed[0] == "io":
            totals.append(len(parsed[1]))
            tasks += [(i, (_run_case, code, case)) for case in parsed[1]]
        else:
            totals.append(parsed[1][1])
            tasks.append((i, (_run_asserts, code, parsed[1][0])))
    passed = [0.0] * len(jobs)
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(tasks) or 1))) as pool:
        futures = [(i, pool.submit(fn, code, arg, limits, mode)) for i, (fn, code, arg) in tasks]
        for i, future in futures:
            got = future.result()
            passed[i] += sum(got) if isinstance(got, list) else got
    return [None if t is None else min(passed[i], t) / t for i, t in enumerate(totals)]


@register("code_tests")
def code_tests(
    prompts: Any = None,
    completions: Any = None,
    completion_ids: Any = None,
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 1024,
    max_processes: int = 32,
    max_output_bytes: int = 1 << 20,
    workers: int | None = None,
    sandbox: str = "auto",
    **columns: Any,
) -> list[float | None]:
    """Fraction of the row's tests (stdin/stdout cases or asserts) the code passes, sandboxed."""
    if sandbox not in ("auto", "namespaces", "rlimits"):
        raise ValueError(f"sandbox must be 'auto', 'namespaces' or 'rlimits', got {sandbox!r}")
    mode = sandbox_mode() if sandbox == "auto" else sandbox
    if sandbox == "namespaces" and sandbox_mode() != "namespaces":
        raise RuntimeError("sandbox='namespaces' requested but unshare does not work here")
    texts = [completion_text(c) for c in completions]
    tests = column(columns, "tests", len(texts), "code_tests")
    jobs = [(extract_code(t), parse_tests(x)) for t, x in zip(texts, tests)]
    limits = SandboxLimits(timeout_s, memory_mb, max_processes, max_output_bytes)
    return score_code(jobs, limits, workers or 2 * (os.cpu_count() or 1), mode)


code_tests.required_columns = ("tests",)  # read from **columns; recipes check it
