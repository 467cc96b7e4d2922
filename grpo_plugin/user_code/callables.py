"""The user's callables named in a recipe or an argument: rewards, tools and `eval_metrics` all
go through `load_callable`, so one spelling works everywhere.

    "package.module:function"   imported; a module that is not importable is then looked for as
                                a file next to the recipe (`base_dir`) and in the working
                                directory (`package/module.py`), so `myrew:lenrew` finds the
                                `myrew.py` beside the recipe without PYTHONPATH
    "path/to/file.py:function"  the file; a relative path next to the recipe (`base_dir`), else
                                in the working directory

`function` may be dotted (`Class.method`). Every failure is a ValueError of one line that names
what was asked for and, for a missing module, every place that was tried.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _load_file(path: Path, name: str) -> Any:
    """Execute `path` as the module `name` (registered in `sys.modules`, so it pickles)."""
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _places(relative: Path, base_dir: str | Path | None) -> list[Path]:
    """Where a file is looked for: next to the recipe (`base_dir`), then the working directory."""
    if relative.is_absolute():
        return [relative]
    places = [Path(base_dir) / relative] if base_dir is not None else []
    return list(dict.fromkeys(p.absolute() for p in [*places, Path.cwd() / relative]))


def _import(module_name: str, base_dir: str | Path | None) -> tuple[Any, list[str]]:
    """The module (or None) and the places tried."""
    if module_name.endswith(".py"):
        tried = _places(Path(module_name), base_dir)
        for path in tried:
            if path.is_file():
                return _load_file(path, f"_grpo_user_{path.stem}"), []
        return None, [str(p) for p in tried]
    try:
        return importlib.import_module(module_name), []
    except ModuleNotFoundError as err:
        if not (err.name and (module_name + ".").startswith(err.name + ".")):
            raise  # the module exists, and an import inside it fails: the user's error
    places = _places(Path(*module_name.split(".")).with_suffix(".py"), base_dir)
    for path in places:
        if path.is_file():
            return _load_file(path, module_name), []
    return None, [f"the module {module_name!r} on sys.path", *(str(p) for p in places)]


def load_callable(spec: str, what: str, base_dir: str | Path | None = None) -> Callable:
    """`spec` ("module:function" or "file.py:function", see the module docstring) as a callable;
    a ValueError naming `what` (e.g. "reward", "tool", "eval_metrics") and the fix otherwise."""
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ValueError(
            f"{what}={spec!r} must be 'module:function' or 'file.py:function' "
            f"(e.g. {what}: my_module:my_function)"
        )
    module_name, attr = (part.strip() for part in spec.split(":"))
    try:
        module, tried = _import(module_name, base_dir)
    except Exception as err:  # user code that fails on import
        raise ValueError(
            f"{what}={spec!r}: importing {module_name!r} failed ({type(err).__name__}: {err})"
        ) from err
    if module is None:
        raise ValueError(
            f"{what}={spec!r}: cannot import {module_name!r}; tried {', '.join(tried)}. Put the "
            "file next to the recipe or in the working directory, or add its folder to PYTHONPATH"
        )
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
    if not callable(obj):
        raise ValueError(f"{what}={spec!r}: {module_name!r} has no function {attr!r}")
    return obj
