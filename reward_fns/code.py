"""``code_tests``: run the completion's Python code against the row's tests in a sandbox.

The code is the last fenced block of the completion (the whole text when there is none; an
unclosed final fence counts), after the row's optional ``code_prefix`` column (source run first:
e.g. HumanEval's imports and helper functions). The ``tests`` column is stdin/stdout cases (``[{"input",
"output"}]``, ``{"inputs": [...], "outputs": [...]}``, or either as JSON text) or a string of
Python statements run after the code, each ``assert`` being one test. The score is the fraction
of tests passed; a run that times out passes none of its tests, nor does a stdin/stdout case
whose program crashes (exit code not 0); with asserts, a judge outside the program's process
decides each one (``reward_fns._code_harness``), so the asserts decided before a crash keep their
verdicts; ``tests`` that cannot be read score ``None``. Code that does not compile scores 0 with no
sandbox started. Why each program passed or failed (syntax error, timeout, no function, ...) is
logged through TRL's ``log_metric`` / ``log_extra`` when a trainer passes them
(``reward_fns.code_outcomes``). Outputs are compared on **all** lines (trailing spaces and
blank lines ignored), not ``zip``-ed over a prefix as in open-r1's checker. Runs go through a
thread pool of ``2 * os.cpu_count()`` workers (sandbox start-up is partly latency, so 2x
oversubscription ran faster than one worker per core: docs/sandbox.md).

The sandbox itself (what is and is not isolated) is documented in ``reward_fns.sandbox``.
"""

from __future__ import annotations

import ast
import json
import os
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from reward_fns import code_outcomes
from reward_fns.registry import column, completion_text, in_process, register
from reward_fns.sandbox import RunResult, SandboxLimits, prepare, run_python

_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)
_OPEN_FENCE = re.compile(r"```[^\n`]*\n")


def extract_code(text: str) -> str:
    """The last fenced code block; an unclosed final fence counts; else the whole text."""
    blocks = _FENCE.findall(text)
    last_open = list(_OPEN_FENCE.finditer(text))
    if last_open and text.count("```") % 2 == 1:  # truncated: the last fence never closes
        return text[last_open[-1].end() :]
    return blocks[-1] if blocks else text


def with_prefix(prefix: str | None, code: str) -> str:
    """The program: the row's ``code_prefix`` (imports, helpers the reply may leave out), then the
    reply's code; no code stays no code."""
    return f"{prefix.rstrip()}\n\n{code}" if prefix and code.strip() else code


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


@dataclass(frozen=True)
class _Sandbox:
    limits: SandboxLimits
    isolation: str
    packages: tuple[str, ...]


def _run_case(code: str, case: tuple[str, str], box: _Sandbox) -> tuple[float, RunResult]:
    """One stdin/stdout case; the output is compared here, outside the sandbox."""
    stdin_text, expected = case
    result = run_python(code, stdin_text, None, box.limits, box.isolation, box.packages)
    ok = not result.timed_out and result.returncode == 0
    return float(ok and outputs_match(result.stdout, expected)), result


def _run_asserts(code: str, tests: str, box: _Sandbox) -> tuple[float, RunResult]:
    """All asserts of a row in one run; the verdicts come from the judge, never the program."""
    result = run_python(code, None, tests, box.limits, box.isolation, box.packages)
    return float(sum(result.verdicts or [])), result


@dataclass(frozen=True)
class Scored:
    """`score_code`'s answer: per job, the fraction of tests passed (None where the tests cannot
    be read) and why it passed or failed (``code_outcomes.OUTCOMES``; None likewise)."""

    scores: list[float | None]
    outcomes: list[str | None]


def score_code(jobs: list[tuple[str, Any]], box: _Sandbox, workers: int) -> Scored:
    """Score each (code, parsed_tests) job in the sandbox. Code that does not compile scores 0
    without a sandbox being started (it would fail every test)."""
    tasks: list[tuple[int, Any]] = []
    totals: list[int | None] = []
    for i, (code, parsed) in enumerate(jobs):
        totals.append(None if parsed is None else _test_count(parsed))
        if parsed is None or not code_outcomes.compiles(code):
            continue
        if parsed[0] == "io":
            tasks += [(i, (_run_case, code, case)) for case in parsed[1]]
        else:
            tasks.append((i, (_run_asserts, code, parsed[1][0])))
    passed = [0.0] * len(jobs)
    runs: list[list[RunResult]] = [[] for _ in jobs]
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(tasks) or 1))) as pool:
        futures = [(i, pool.submit(fn, code, arg, box)) for i, (fn, code, arg) in tasks]
        for i, future in futures:
            got, result = future.result()
            passed[i] += got
            runs[i].append(result)
    scores = [None if t is None else min(passed[i], t) / t for i, t in enumerate(totals)]
    outcomes = [
        None
        if t is None
        else code_outcomes.outcome(code, _assert_source(parsed), runs[i], passed[i], t)
        for i, ((code, parsed), t) in enumerate(zip(jobs, totals))
    ]
    return Scored(scores, outcomes)


def _test_count(parsed: tuple[str, Any]) -> int:
    return len(parsed[1]) if parsed[0] == "io" else parsed[1][1]


def _assert_source(parsed: tuple[str, Any] | None) -> str | None:
    return parsed[1][0] if parsed is not None and parsed[0] == "asserts" else None


@register("code_tests")
@in_process
def code_tests(
    prompts: Any = None,
    completions: Any = None,
    completion_ids: Any = None,
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 1024,
    max_processes: int = 32,
    max_output_bytes: int = 1 << 20,
    workdir_mb: int = 64,
    workers: int | None = None,
    isolation: str = "auto",
    packages: Sequence[str] = (),
    log_metric: Callable[[str, float], None] | None = None,
    log_extra: Callable[[str, list], None] | None = None,
    **columns: Any,
) -> list[float | None]:
    """Fraction of the row's tests (stdin/stdout cases or asserts) the code passes, sandboxed.

    ``isolation``: ``auto`` (best available, logged), ``strict`` (refuse to run without a
    minimal root: ``bwrap`` or ``pivot_root`` as root, ``bwrap-user`` otherwise), or a level
    from ``reward_fns.sandbox.LEVELS``. ``packages``: top-level
    packages the code may import besides the standard library (e.g. ``["numpy"]``).
    ``workdir_mb``: size of the program's tmpfs work directory. ``log_metric`` / ``log_extra``
    (TRL's, passed by the trainer): why each program passed or failed (``code_outcomes``).
    """
    if "sandbox" in columns:  # renamed: **columns would otherwise swallow it silently
        raise TypeError("code_tests: `sandbox=` is now `isolation=` ('namespaces' -> 'strict')")
    packages = (packages,) if isinstance(packages, str) else tuple(packages)
    limits = SandboxLimits(timeout_s, memory_mb, max_processes, max_output_bytes, workdir_mb)
    prepare(isolation, packages, limits)  # raises here, once, if the machine cannot provide it
    texts = [completion_text(c) for c in completions]
    tests = column(columns, "tests", len(texts), "code_tests")
    prefixes = columns.get("code_prefix") or [""] * len(texts)
    codes = [with_prefix(p, extract_code(t)) for p, t in zip(prefixes, texts)]
    jobs = [(code, parse_tests(x)) for code, x in zip(codes, tests)]
    box = _Sandbox(limits, isolation, packages)
    scored = score_code(jobs, box, workers or 2 * (os.cpu_count() or 1))
    code_outcomes.log_outcomes(scored.outcomes, log_metric, log_extra)
    return scored.scores


code_tests.required_columns = ("tests",)  # read from **columns; recipes check it
