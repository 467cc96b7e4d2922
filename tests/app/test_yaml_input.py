"""The user's YAML is read with a bound on what its aliases expand to, counted without
expanding them (issue 56: 802 bytes of recipe stood for 43 million values)."""

from __future__ import annotations

import pytest
import yaml

from grpo_plugin import cli
from grpo_plugin.app.recipe import RecipeError, load_recipe
from grpo_plugin.app.yaml_input import YAMLTooLarge, expanded_size, safe_load


def alias_bomb(levels: int, width: int = 9, indent: str = "  ") -> str:
    """`levels` anchors, each a list of `width` aliases of the one before: width**levels leaves."""
    lines = [f"{indent}l0: &l0 [{', '.join(['x'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"{indent}l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def test_sizes_count_every_use_of_an_alias():
    assert expanded_size(yaml.compose("a: 1")) == 3  # the mapping, its key, its value
    assert expanded_size(yaml.compose("a: &x [1, 2]\nb: *x\nc: *x")) == 1 + 3 * (1 + 3)
    # l0 = [x, x, x]: 4; l1 = [*l0] x 3: 1 + 3 * 4 = 13; l2: 1 + 3 * 13 = 40; keys 3, mapping 1
    assert expanded_size(yaml.compose(alias_bomb(3, 3, ""))) == 1 + 3 + 4 + 13 + 40
    assert expanded_size(None) == 0


def test_small_documents_with_aliases_load_as_pyyaml_loads_them():
    text = "base: &b {lr: 1.0e-4, steps: 3}\nrun: *b\nlist: [*b, *b]\n"
    assert safe_load(text) == yaml.safe_load(text)
    assert safe_load("") is None


def test_a_bomb_is_refused_before_anything_is_built(monkeypatch):
    built = []
    monkeypatch.setattr(
        yaml.SafeLoader, "construct_document", lambda self, node: built.append(node)
    )
    text = "kwargs:\n" + alias_bomb(9)  # 9**9 = 387 million leaves in 500 bytes
    assert len(text) < 600
    with pytest.raises(YAMLTooLarge, match=r"^recipe r.yaml: expands to more than 100,000"):
        safe_load(text, "recipe r.yaml")
    assert built == []


def test_a_list_that_holds_itself_is_refused():
    with pytest.raises(YAMLTooLarge, match="expands to more than"):
        safe_load("a: &a [1, *a]")


def test_the_bound_is_the_limit_given():
    text = "a: &a [1, 2, 3]\nb: [*a, *a]"  # 1 + 2 + 4 + (1 + 2 * 4) = 16
    assert expanded_size(yaml.compose(text)) == 16
    assert safe_load(text, limit=16) == {"a": [1, 2, 3], "b": [[1, 2, 3], [1, 2, 3]]}
    with pytest.raises(YAMLTooLarge):
        safe_load(text, limit=15)


def test_a_recipe_bomb_in_a_free_form_mapping_is_one_line(tmp_path, capsys):
    """The issue's case: `lr_scheduler_kwargs`, whose values no field type checks."""
    recipe = tmp_path / "bomb.yaml"
    recipe.write_text("dataset: {name: arithmetic}\nlr_scheduler_kwargs:\n" + alias_bomb(8))
    assert cli.main(["train", str(recipe), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: recipe {recipe}: expands to more than 100,000 values (YAML aliases?); write "
        "the values out, or use fewer nested aliases"
    ]


@pytest.mark.parametrize(
    ("flag", "named"),
    [
        ("--lora.target_modules", "--lora.target_modules"),
        ("--dataset", "dataset"),
        ("--reward_funcs", "reward_funcs"),
    ],
    ids=["dotted-flag", "mapping-flag", "list-flag"],
)
def test_a_bomb_in_a_flag_is_refused(flag, named, tmp_path):
    bomb = alias_bomb(8, indent="").replace("\n", ", ")
    value = f"[{{{bomb}}}]" if flag == "--reward_funcs" else f"{{{bomb}}}"
    with pytest.raises(RecipeError, match=f"^{named}: expands to more than 100,000"):
        load_recipe("arithmetic", [flag, value, "--output_dir", str(tmp_path)])


def test_eval_dataset_mapping_is_bounded_and_a_yaml_error_is_one_line(capsys):
    base = ["eval", "--model", "x", "--reward", "last_integer", "--dataset"]
    bomb = "{" + alias_bomb(8, indent="").replace("\n", ", ") + "}"
    assert cli.main([*base, bomb]) == 2
    assert "error: --dataset: expands to more than 100,000" in capsys.readouterr().err
    assert cli.main([*base, "{name: [unclosed"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not valid YAML: while parsing a flow sequence" in err[0]
