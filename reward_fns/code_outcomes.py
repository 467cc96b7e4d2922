"""Why a program passed or failed its tests: one outcome per scored completion (``code_tests``).

    passed          every test passed
    partial         some tests passed, not all
    wrong_answer    it ran to the end and no test passed
    runtime_error   the program itself crashed (a traceback, a non-zero exit, killed for memory)
    timeout         it ran past ``timeout_s``
    syntax_error    it has a `def` and does not compile (decided on the host: no sandbox started)
    no_function     no code (empty, or prose with no `def` that does not compile), or code that
                    defines none of the names the tests call

A user reads these to tell "the model writes garbage" (syntax errors, no function) from "the
sandbox is broken" (every program a runtime error or a timeout, even the right ones). They are
diagnostics, never rewards: the score is the fraction of tests passed whatever the outcome.
Trainers see them through TRL's ``log_metric`` as ``outcome/code_tests/<outcome>`` (the share of
the step's completions) and ``log_extra`` as the completions table's ``code_outcome`` column.
"""

from __future__ import annotations

import ast
import builtins
import re
from collections.abc import Callable, Sequence
from typing import Any

OUTCOMES = (
    "passed",
    "partial",
    "wrong_answer",
    "runtime_error",
    "timeout",
    "syntax_error",
    "no_function",
)
METRIC_PREFIX = "outcome/code_tests/"  # + an outcome: its share of the scored completions
EXTRA_COLUMN = "code_outcome"  # the completions table's column: one outcome per completion
_BUILTINS = frozenset(dir(builtins))
_DEF = re.compile(r"^\s*(async\s+)?def\s", re.MULTILINE)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def compiles(code: str) -> bool:
    """Whether ``code`` compiles as a module (nothing of it runs)."""
    try:
        compile(code, "solution.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False  # ValueError: a NUL byte; the others: pathological nesting or constants
    return True


def _top_level_nodes(tree: ast.Module) -> list[ast.AST]:
    """Every node of the module outside function, class and lambda bodies (their names are
    local); the definitions themselves are kept."""
    nodes, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        nodes.append(node)
        if not isinstance(node, _SCOPES):
            todo.extend(ast.iter_child_nodes(node))
    return nodes


def _bound(nodes: list[ast.AST]) -> set[str]:
    """The names a list of top-level nodes binds (definitions, assignments, imports, loops)."""
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
    return names


def defined_names(code: str) -> set[str]:
    """The module-level names ``code`` binds (empty when it does not parse)."""
    try:
        return _bound(_top_level_nodes(ast.parse(code)))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()


def names_tests_call(tests: str) -> set[str]:
    """The names the tests read at module level that they neither bind nor take from builtins,
    nor use as a module (``math.isclose``): the names the code must define."""
    try:
        nodes = _top_level_nodes(ast.parse(tests))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    read = {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    modules = {
        n.value.id for n in nodes if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
    }
    return read - _bound(nodes) - _BUILTINS - modules


def _crashed(run: Any) -> bool:
    """A run that ended badly on its own: a traceback, a non-zero exit, a memory kill."""
    return (
        run.oom_kills > 0
        or (run.returncode not in (0, None))
        or "Traceback (most recent call last)" in run.stderr
    )


def outcome(code: str, tests: str | None, runs: Sequence[Any], passed: float, total: int) -> str:
    """The outcome of one completion: its extracted ``code``, the assert source of its tests
    (None: stdin/stdout cases), the sandbox's ``runs`` (``RunResult``s; none when it did not
    compile) and its ``passed`` of ``total`` tests."""
    if not code.strip():
        return "no_function"
    if not runs:  # it did not compile: broken code, or prose with no function in it
        return "syntax_error" if _DEF.search(code) else "no_function"
    if passed >= total:
        return "passed"
    if passed > 0:
        return "partial"
    if any(run.timed_out for run in runs):
        return "timeout"
    if tests is not None:
        needed = names_tests_call(tests)
        if needed and not needed & defined_names(code):
            return "no_function"
    return "runtime_error" if any(_crashed(run) for run in runs) else "wrong_answer"


def log_outcomes(
    outcomes: list[str | None],
    log_metric: Callable[[str, float], None] | None,
    log_extra: Callable[[str, list], None] | None,
) -> None:
    """Hand the outcomes to a trainer (TRL's ``log_metric`` / ``log_extra``): per outcome, one
    0/1 value per scored completion, so the step's mean is the outcome's share; None (tests
    that cannot be read) is left out of the shares."""
    if log_extra is not None:
        log_extra(EXTRA_COLUMN, list(outcomes))
    if log_metric is None:
        return
    scored = [o for o in outcomes if o is not None]
    for name in OUTCOMES:
        for o in scored:
            log_metric(METRIC_PREFIX + name, float(o == name))
