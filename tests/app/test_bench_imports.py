"""The benchmark scripts import only names the library has (they import inside `main`, after
setting the thread count, so loading them does not check it)."""

from __future__ import annotations

import ast
import importlib

import pytest
from conftest import REPO_ROOT

SCRIPTS = sorted((REPO_ROOT / "benchmarks").glob("*.py"))


def _library_imports(path) -> list[tuple[str, str]]:
    tree = ast.parse(path.read_text())
    return [
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and (node.module or "").startswith(("grpo_plugin", "reward_fns"))
        for alias in node.names
    ]


def _exists(module: str, name: str) -> bool:
    if hasattr(importlib.import_module(module), name):
        return True
    try:  # `from package import submodule`
        importlib.import_module(f"{module}.{name}")
    except ModuleNotFoundError:
        return False
    return True


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_benchmark_imports_resolve(path):
    missing = [
        f"{module}.{name}" for module, name in _library_imports(path) if not _exists(module, name)
    ]
    assert missing == []
