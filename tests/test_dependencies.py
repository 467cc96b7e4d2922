"""The declared dependency floors are the ones CI's floors step (`.ci/floors`) installs.

`.ci/floors.py` reads the pins from pyproject.toml; these tests read pyproject.toml on their own
(with `packaging`, as pip does) and check that both agree, so the floors cannot drift apart.
docs/dependencies.md lists the floors and what runs where.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

import pytest
import tomllib
from conftest import REPO_ROOT
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def _load_floors():
    spec = importlib.util.spec_from_file_location("ci_floors", REPO_ROOT / ".ci" / "floors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


floors_helper = _load_floors()


def _declared() -> list[Requirement]:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extras in project["optional-dependencies"].values():
        lines += extras
    return [Requirement(line) for line in lines]


def _lower_bounds() -> dict[str, set[str]]:
    bounds: dict[str, set[str]] = {}
    for req in _declared():
        for spec in req.specifier:
            if spec.operator == ">=":
                bounds.setdefault(canonicalize_name(req.name), set()).add(spec.version)
    return bounds


def test_the_floors_step_pins_the_declared_lower_bounds():
    bounds = _lower_bounds()
    pins = floors_helper.floors()
    assert set(pins) == {canonicalize_name(name) for name in floors_helper.FLOORED}
    for name, version in pins.items():
        # one floor a package, wherever it is declared (trl: both `bench` and `dev`)
        assert bounds[name] == {version}, (name, bounds[name], version)


def test_the_floors_step_installs_every_other_dependency_as_declared():
    requirements = [Requirement(line) for line in floors_helper.requirements()]
    by_name = {canonicalize_name(r.name): r for r in requirements}
    for name, version in floors_helper.floors().items():
        assert str(by_name[name].specifier) == f"=={version}"
    assert "torch" not in by_name  # .ci/floors installs the CPU build itself
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    for line in project["dependencies"] + project["optional-dependencies"]["dev"]:
        name = canonicalize_name(Requirement(line).name)
        skipped = {canonicalize_name(s) for s in floors_helper.SKIPPED}
        assert name in by_name or name in skipped, name


def test_every_floor_has_a_version_in_every_declared_range():
    """A floor that its own upper bound (or another declaration) excludes is no floor at all."""
    pins = floors_helper.floors()
    for req in _declared():
        name = canonicalize_name(req.name)
        if name in pins:
            assert req.specifier.contains(pins[name]), (str(req), pins[name])


@pytest.mark.parametrize("req", _declared(), ids=str)
def test_this_environment_satisfies_what_is_declared(req):
    """The venv the tests run in (main or floors) is inside the declared ranges."""
    try:
        installed = importlib.metadata.version(req.name)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{req.name} is not installed here")
    assert req.specifier.contains(installed, prereleases=True), (str(req), installed)


def test_ci_runs_the_floors_step():
    script = (REPO_ROOT / ".ci" / "floors").read_text()
    assert ".ci/floors.py requirements" in script
    assert "--no-deps -e ." in script
    assert "test-floors:" in (REPO_ROOT / "Makefile").read_text()
    assert "make test-floors" in (REPO_ROOT / ".ci" / "run").read_text()
