"""The README's Python examples import only names that exist (renames cannot rot the docs)."""

from __future__ import annotations

import ast
import re

from conftest import REPO_ROOT

BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def test_readme_python_blocks_parse_and_their_imports_resolve():
    blocks = BLOCK.findall((REPO_ROOT / "README.md").read_text())
    assert blocks, "the README has Python examples"
    imported = 0
    for block in blocks:
        for node in ast.parse(block).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                exec(compile(ast.Module([node], []), "README.md", "exec"), {})
                imported += 1
    assert imported >= 3
