"""The five longest functions and the five with the most parameters in grpo_plugin/.

    .venv/bin/python benchmarks/function_stats.py [--top 5]

Lines: a function's source lines from its `def` (decorators excluded) to its last line, nested
functions counted inside their parent too. Parameters: positional-only,
positional and keyword-only, without a leading self/cls; *args and **kwargs one each (the one
rule: tests/test_architecture.py checks its 6-parameter bound with `functions()`). Prints two
plain-text tables with file:line.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "grpo_plugin"


def parameter_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = node.args
    names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def functions() -> list[tuple[str, str, int, int]]:
    """`(qualified name, file:line, lines, parameters)` of every function in the package."""

    def walk(node, prefix, where):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.", where)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = child.end_lineno - child.lineno + 1
                name = f"{prefix}{child.name}"
                yield name, f"{where}:{child.lineno}", lines, parameter_count(child)
                yield from walk(child, f"{name}.", where)
            else:
                yield from walk(child, prefix, where)

    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(ROOT).as_posix()
        out += walk(ast.parse(path.read_text()), "", where)
    return out


def table(title: str, rows: list[tuple[str, str, int, int]], key: int) -> str:
    head = ("function", "where", "lines" if key == 2 else "params")
    body = [(r[0], r[1], str(r[key])) for r in rows]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(3)]

    def fmt(r) -> str:
        return f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}"

    return "\n".join([title, fmt(head), fmt(["-" * w for w in widths]), *map(fmt, body)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=5)
    top = parser.parse_args().top
    found = functions()
    longest = sorted(found, key=lambda r: (-r[2], r[1]))[:top]
    widest = sorted(found, key=lambda r: (-r[3], r[1]))[:top]
    print(f"{len(found)} functions in grpo_plugin/\n")
    print(table(f"The {top} longest (lines)", longest, 2) + "\n")
    print(table(f"The {top} with the most parameters", widest, 3))


if __name__ == "__main__":
    main()
