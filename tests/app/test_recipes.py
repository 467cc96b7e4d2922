"""Every recipe under recipes/ loads and validates (no model, no training); recipe parsing rules."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import GSM8K_DIR, REPO_ROOT

from grpo_plugin.app.data import load_prompt_datasets
from grpo_plugin.app.recipe import RecipeError, build_recipe, load_recipe
from grpo_plugin.app.recipe_checks import check_recipe, required_columns

ROOT = REPO_ROOT
ACCELERATE = ROOT / "recipes" / "accelerate"  # launcher configs, not recipes (test_distributed.py)
RECIPES = [
    p
    for p in sorted((ROOT / "recipes").rglob("*.yaml")) + sorted((ROOT / "recipes").rglob("*.yml"))
    if ACCELERATE not in p.parents
]
GSM8K_LOCAL = [
    "--dataset.path", str(GSM8K_DIR / "train.jsonl"),
    "--dataset.eval_path", str(GSM8K_DIR / "test.jsonl"),
]  # fmt: skip


def _offline_flags(path: Path) -> list[str]:
    """GSM8K recipes default to the Hub; tests point them at the local JSONL copies."""
    spec = (yaml.safe_load(path.read_text()) or {}).get("dataset") or {}
    if spec.get("name") == "gsm8k" and "path" not in spec:
        if not GSM8K_DIR.is_dir():
            pytest.skip(f"local GSM8K copy not found at {GSM8K_DIR}")
        return GSM8K_LOCAL
    return []


def test_the_four_recipes_exist():
    names = {p.name for p in RECIPES}
    assert {"arithmetic.yaml", "gsm8k_qlora.yaml", "gsm8k_gspo.yaml", "dapo.yaml"} <= names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(ROOT)))
def test_recipe_loads_and_validates(path: Path):
    assert path.read_text().lstrip().startswith("#"), "a recipe opens with a header comment"
    recipe = load_recipe(path, _offline_flags(path))
    rewards = check_recipe(recipe)
    assert len(rewards) == len(recipe.args.reward_funcs) >= 1
    assert all(callable(fn) for fn in rewards)
    c = recipe.config
    assert c.generation_batch_size % c.num_generations == 0
    assert c.max_steps > 0 and c.output_dir


def test_arithmetic_is_the_demo_the_issue_asks_for():
    recipe = load_recipe(ROOT / "recipes" / "arithmetic.yaml")
    args, c = recipe.args, recipe.config
    assert args.model == "embedded:smollm2-135m-instruct"
    assert args.lora["r"] == 16 and args.lora["target_modules"] == "all-linear"
    assert c.num_generations == 8
    assert args.reward_funcs == ["last_integer"]
    train, held_out = load_prompt_datasets(args.dataset)
    assert len(train) == 64 and len(held_out) >= 64
    pairs = {str(r["prompt"]) for r in train}
    assert not pairs & {str(r["prompt"]) for r in held_out}, "held-out prompts are unseen"
    again = load_prompt_datasets(args.dataset)[1]
    assert again["prompt"] == held_out["prompt"], "the split is fixed by the seed"


def test_gsm8k_and_dapo_recipes_set_their_algorithms():
    gspo = load_recipe(ROOT / "recipes" / "gsm8k_gspo.yaml").config
    assert gspo.importance_sampling_level == "sequence" and gspo.beta == 0
    assert gspo.epsilon < 1e-3 and gspo.epsilon_high < 1e-3
    qlora = load_recipe(ROOT / "recipes" / "gsm8k_qlora.yaml")
    assert qlora.args.load_in_4bit and qlora.args.lora is not None
    assert qlora.args.reward_funcs[0] == "gsm8k" and len(qlora.args.reward_funcs) == 2
    dapo = load_recipe(ROOT / "recipes" / "dapo.yaml")
    assert dapo.config.epsilon_high == pytest.approx(0.28)
    assert dapo.config.loss_type == "dapo" and dapo.config.dynamic_sampling
    names = [r if isinstance(r, str) else r["name"] for r in dapo.args.reward_funcs]
    assert "soft_overlong" in names


def test_soft_overlong_gets_max_completion_length_from_the_config():
    recipe = load_recipe(ROOT / "recipes" / "dapo.yaml")
    overlong = check_recipe(recipe)[1]
    L = recipe.config.max_completion_length  # 48, cache 16: the last 16 tokens are punished
    scores = overlong(
        prompts=["p"] * 3, completions=["x"] * 3, completion_ids=[[0] * 32, [0] * 40, [0] * L]
    )
    assert scores == pytest.approx([0.0, -0.5, -1.0])


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    return path


def test_flags_override_yaml_and_dotted_flags_edit_mappings(tmp_path):
    path = _write(
        tmp_path,
        "dataset: {name: arithmetic, seed: 0}\nmax_steps: 5\nlora: {r: 8}\n"
        "per_device_train_batch_size: 8\noutput_dir: out\n",
    )
    recipe = load_recipe(
        path,
        ["--max_steps", "7", "--dataset.seed", "3", "--lora.r=4", "--learning-rate", "1e-3",
         "--no_shuffle_dataset"],
    )  # fmt: skip
    assert recipe.config.max_steps == 7  # flag beats YAML
    assert recipe.config.learning_rate == pytest.approx(1e-3)  # typed by HfArgumentParser
    assert recipe.config.shuffle_dataset is False
    assert recipe.args.dataset == {"name": "arithmetic", "seed": 3}  # other keys kept
    assert recipe.args.lora == {"r": 4}
    assert recipe.raw["max_steps"] == 7  # what gets copied to recipe.yaml


def test_reward_entries_with_params(tmp_path):
    path = _write(
        tmp_path,
        "dataset: {name: arithmetic}\noutput_dir: out\n"
        "reward_funcs: [{name: last_integer, params: {column_name: answer}}, exact_integer]\n",
    )
    rewards = check_recipe(load_recipe(path))
    assert [fn.__name__ for fn in rewards] == ["last_integer", "exact_integer"]
    bad = _write(tmp_path, "dataset: {name: arithmetic}\nreward_funcs: [{nme: last_integer}]\n")
    with pytest.raises(RecipeError, match="name: NAME"):
        check_recipe(load_recipe(bad))


def test_required_columns_from_signatures():
    import reward_fns

    def needs_solution(prompts, completions, solution, completion_ids=None, **kw):
        return [0.0] * len(completions)

    assert required_columns(reward_fns.get("last_integer")) == {"answer"}
    assert required_columns(reward_fns.get("gsm8k", column_name="gold")) == {"gold"}
    assert required_columns(needs_solution) == {"solution"}
    assert required_columns(reward_fns.get("think_format")) == set()


def test_unknown_key_suggests_the_close_match():
    with pytest.raises(
        RecipeError, match=r"unknown recipe key 'learnig_rate'; did you mean 'learning_rate'\?"
    ):
        build_recipe({"dataset": {"name": "arithmetic"}, "learnig_rate": 1e-4})
    with pytest.raises(RecipeError, match="no `dataset`"):
        build_recipe({})
