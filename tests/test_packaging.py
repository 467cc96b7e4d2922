"""The wheel: every module, the report's page, the built-in recipes and the licence travel with it."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest
from conftest import REPO_ROOT


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(REPO_ROOT)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (path,) = out.glob("grpo_plugin-*.whl")
    return zipfile.ZipFile(path)


def test_wheel_holds_every_module(wheel):
    names = set(wheel.namelist())
    for package in ("grpo_plugin", "reward_fns"):
        for source in (REPO_ROOT / package).rglob("*.py"):
            if "__pycache__" not in source.parts:
                assert source.relative_to(REPO_ROOT).as_posix() in names, source


def test_wheel_holds_the_report_page(wheel):
    """report.html is built from a page that is not a module: it must travel too."""
    page = "grpo_plugin/publish/report_page.html"
    assert page in set(wheel.namelist())
    assert wheel.read(page) == (REPO_ROOT / page).read_bytes()


def test_wheel_holds_the_recipes_and_the_license(wheel):
    names = set(wheel.namelist())
    for recipe in (REPO_ROOT / "recipes").glob("*.yaml"):
        assert f"grpo_plugin/recipes/{recipe.name}" in names
    assert "grpo_plugin/recipes/tool_use_tools.py" in names  # the tool file tool_use.yaml names
    licences = [n for n in names if n.endswith("LICENSE")]
    assert licences and "Apache License" in wheel.read(licences[0]).decode()
    metadata = next(n for n in names if n.endswith("METADATA"))
    assert "Apache-2.0" in wheel.read(metadata).decode()


def test_license_file_matches_pyproject():
    import tomllib

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert (REPO_ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
