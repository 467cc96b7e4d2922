"""One loader for the user's callables (rewards, tools, eval_metrics): 'module:function' and
'file.py:function', found next to the recipe or in the working directory; failures say what was
tried."""

from __future__ import annotations

import sys

import pytest

from grpo_plugin.user_code.callables import load_callable

CODE = "def lenrew(completions, **kw):\n    return [float(len(c)) for c in completions]\n"


def test_a_file_and_a_module_next_to_the_recipe_or_in_the_working_dir(tmp_path, monkeypatch):
    recipes, work = tmp_path / "recipes", tmp_path / "work"
    recipes.mkdir()
    work.mkdir()
    (recipes / "uc_beside.py").write_text(CODE)
    (work / "uc_here.py").write_text(CODE)
    monkeypatch.chdir(work)
    for spec in ("uc_beside.py:lenrew", "uc_beside:lenrew", "uc_here.py:lenrew", "uc_here:lenrew"):
        fn = load_callable(spec, "reward", base_dir=recipes)
        assert fn(["ab"]) == [2.0] and fn.__name__ == "lenrew"
    assert sys.modules["uc_beside"].lenrew is load_callable("uc_beside:lenrew", "reward")


def test_a_missing_module_says_every_place_tried(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as err:
        load_callable("uc_nowhere:fn", "reward", base_dir=tmp_path / "recipes")
    message = str(err.value)
    assert message.startswith("reward='uc_nowhere:fn': cannot import 'uc_nowhere'; tried ")
    assert "on sys.path" in message and str(tmp_path / "recipes" / "uc_nowhere.py") in message
    assert str(tmp_path / "uc_nowhere.py") in message and "PYTHONPATH" in message
    (tmp_path / "uc_broken.py").write_text("import no_such_dependency_xyz\n")
    with pytest.raises(ValueError, match="importing 'uc_broken' failed \\(ModuleNotFoundError"):
        load_callable("uc_broken:fn", "tool")
    (tmp_path / "uc_ok.py").write_text(CODE)
    with pytest.raises(ValueError, match="'uc_ok.py' has no function 'nope'"):
        load_callable("uc_ok.py:nope", "eval_metrics")
