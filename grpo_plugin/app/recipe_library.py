"""Built-in recipes: the YAML files of `recipes/`, shipped in the wheel as `grpo_plugin/recipes/`.

`grpo-plugin train arithmetic` finds `arithmetic.yaml` here; `grpo-plugin recipes` lists them with
the one-line purpose each file states in its first comment line. In a source checkout (an editable
install) the files are read from the repository's `recipes/` folder.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]  # grpo_plugin/


def recipe_dir() -> Path:
    """`grpo_plugin/recipes` in an installed wheel, else the checkout's `recipes/`."""
    for candidate in (_PACKAGE / "recipes", _PACKAGE.parent / "recipes"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("no built-in recipes found: the installation is incomplete")


def builtin_recipes() -> dict[str, Path]:
    """Name -> path of every built-in recipe (sorted by name)."""
    try:
        folder = recipe_dir()
    except FileNotFoundError:
        return {}
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def purpose(path: Path) -> str:
    """The recipe's one-line purpose: its first comment line, without the leading '#'."""
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
        if line.strip():
            break
    return ""


def find_recipe(name_or_path: str | Path) -> Path:
    """A YAML path as given, or the built-in recipe of that name (`arithmetic`); a folder or a
    name neither is raises an OSError whose message says what to pass."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    builtins = builtin_recipes()
    if str(name_or_path) in builtins:
        return builtins[str(name_or_path)]
    if path.is_dir():
        inside = sorted(p.name for p in path.iterdir() if p.suffix in (".yaml", ".yml"))
        hint = f"did you mean {path / inside[0]}?" if inside else "it holds no .yaml file"
        raise IsADirectoryError(
            f"recipe {str(name_or_path)!r} is a folder, not a recipe file ({hint})"
        )
    known = ", ".join(builtins) or "none installed"
    raise FileNotFoundError(
        f"recipe {str(name_or_path)!r} not found: pass a YAML file or a built-in recipe name "
        f"({known}; `grpo-plugin recipes` lists them)"
    )


def format_recipes() -> str:
    """The table `grpo-plugin recipes` prints."""
    rows = [(name, purpose(path)) for name, path in builtin_recipes().items()]
    width = max((len(name) for name, _ in rows), default=0)
    return "\n".join(f"{name.ljust(width)}  {text}" for name, text in rows)
