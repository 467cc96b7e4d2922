"""Every recipe under recipes/ loads and validates (no model, no training); recipe parsing rules."""

from __future__ import annotations

import re
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
    assert (c.num_generations, c.per_device_train_batch_size) == (4, 16)  # 4 prompts a step
    assert c.lr_scheduler_type == "cosine" and c.epsilon_high == pytest.approx(0.28)
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


ARITH = {"dataset": {"name": "arithmetic"}}


def test_yaml_strings_are_read_as_the_fields_types(tmp_path):
    """PyYAML reads `1e-3` as a string; a float field takes it as 0.001, an int field "8"."""
    path = tmp_path / "r.yaml"
    path.write_text("dataset: {name: arithmetic}\nlearning_rate: 1e-3\nnum_generations: '4'\n")
    recipe = load_recipe(path, ["--per_device_train_batch_size", "8"])
    assert recipe.config.learning_rate == 1e-3 and recipe.config.num_generations == 4
    assert recipe.raw["learning_rate"] == 1e-3  # recipe.yaml records the number
    recipe = build_recipe({**ARITH, "max_steps": 8.0, "beta": 0, "reward_weights": ["2"]})
    assert recipe.config.max_steps == 8 and isinstance(recipe.config.max_steps, int)
    assert recipe.config.beta == 0.0 and recipe.config.reward_weights == [2.0]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("num_generations", "eight", "num_generations must be an integer, got 'eight'."),
        ("beta", True, "beta must be a number, got True (YAML reads yes/no"),
        ("max_steps", 2.5, "max_steps must be an integer, got 2.5."),
        ("max_prompt_length", "long", "max_prompt_length must be an integer or null, got 'long'"),
        ("learning_rate", None, "learning_rate must be a number, got None."),
        ("load_in_4bit", "maybe", "load_in_4bit must be true or false, got 'maybe'"),
    ],
)
def test_values_the_type_does_not_allow_get_one_line_naming_the_field(key, value, message):
    with pytest.raises(RecipeError) as err:
        build_recipe({**ARITH, key: value})
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max_steps", "2.5"], "max_steps must be an integer, got '2.5' (flag --max_steps)."),
        (["--beta", "yes"], "beta must be a number, got 'yes' (flag --beta)."),
    ],
)
def test_flags_with_the_wrong_type_name_the_field(flags, message):
    with pytest.raises(RecipeError, match=re.escape(message)):
        load_recipe(None, ["--dataset.name", "arithmetic", *flags])


@pytest.mark.parametrize("value", ["-1e-4", "-1.5E-3", "-2.", "-inf"])
def test_a_negative_number_in_any_notation_is_a_flags_value(value):
    """Issue 56: `--learning_rate -1e-4` failed in argparse ('expected one argument'); the
    config's own check gives the line now."""
    with pytest.raises(RecipeError, match=r"^learning_rate=-\S+ must be a (positive )?finite"):
        load_recipe(None, ["--dataset.name", "arithmetic", "--learning_rate", value])


def test_a_field_that_takes_negatives_takes_them_from_flags():
    """A penalty reward's weight is negative: `--reward_weights 1 -5e-1` is two values."""
    flags = ["--reward_funcs", "last_integer", "think_format", "--reward_weights", "1", "-5e-1"]
    recipe = load_recipe(None, ["--dataset.name", "arithmetic", *flags])
    assert recipe.config.reward_weights == [1.0, -0.5]
    assert len(check_recipe(recipe)) == 2  # the weights pass the recipe's checks too


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("model_name_or_path", "a recipe says `model: NAME_OR_DIR`"),
        ("dataset_name", "a recipe says `dataset: {name: NAME}`"),
        ("lora_r", "a recipe says `lora: {r: N}`"),
    ],
)
def test_trl_script_arguments_point_to_the_recipe_key(key, hint):
    with pytest.raises(RecipeError, match=re.escape(hint)):
        build_recipe({**ARITH, key: "x"})
    with pytest.raises(RecipeError, match=re.escape(hint)):
        load_recipe(None, ["--dataset.name", "arithmetic", f"--{key}", "x"])


@pytest.mark.parametrize("spec", ["fr_myrew.py:lenrew", "fr_myrew:lenrew"])
def test_a_reward_file_next_to_the_recipe(tmp_path, monkeypatch, spec):
    """Rewards are named like tools and eval_metrics: 'file.py:fn' or 'module:fn' beside the
    recipe, without PYTHONPATH (one loader: user_code/callables.py)."""
    monkeypatch.chdir(tmp_path.parent)  # not the recipe's folder
    (tmp_path / "fr_myrew.py").write_text(
        "def lenrew(completions, **kw):\n    return [float(len(c)) for c in completions]\n"
    )
    path = tmp_path / "r.yaml"
    path.write_text(f"dataset: {{name: arithmetic}}\nreward_funcs: [{spec!r}]\n")
    (fn,) = check_recipe(load_recipe(path))
    assert fn.__name__ == "lenrew" and fn(completions=["abc"]) == [3.0]
    path.write_text("dataset: {name: arithmetic}\nreward_funcs: ['fr_nope:lenrew']\n")
    with pytest.raises(RecipeError, match=r"cannot import 'fr_nope'; tried .*PYTHONPATH"):
        check_recipe(load_recipe(path))


def test_progress_is_on_unless_the_recipe_turns_it_off():
    """The CLI sets transformers' log level to errors, and transformers then turns `disable_tqdm`
    on by itself (its default follows the log level): the bar nobody asked to hide was hidden."""
    import transformers

    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # as cli.quiet_logs
    try:
        shown = load_recipe(None, ["--dataset.name", "arithmetic"])
        hidden = load_recipe(None, ["--dataset.name", "arithmetic", "--disable_tqdm", "true"])
    finally:
        transformers.logging.set_verbosity(level)
    assert shown.config.disable_tqdm is False and hidden.config.disable_tqdm is True
    assert "disable_tqdm" not in shown.raw  # recipe.yaml keeps what the user wrote


def test_a_builtin_recipe_by_name_finds_its_tool_file_from_any_folder(tmp_path, monkeypatch):
    # issue 45: `grpo-plugin train tool_use` looked for tool_use_tools.py beside the *name*,
    # i.e. in the working directory, so it worked only from inside recipes/
    from grpo_plugin.app.recipe_checks import recipe_tools

    monkeypatch.chdir(tmp_path)
    recipe = load_recipe("tool_use")
    assert Path(recipe.source).resolve() == (ROOT / "recipes" / "tool_use.yaml").resolve()
    (multiply,) = recipe_tools(recipe)
    assert multiply(a=12, b=34) == 408


def test_list_flags_take_a_yaml_list_as_the_yaml_does():
    # `--reward_funcs '[{name: soft_overlong, ...}]'` was one reward named "[{name: ..."
    flags = ["--reward_funcs", "[last_integer, {name: soft_overlong, params: {cache_length: 4}}]"]
    recipe = load_recipe(None, ["--dataset.name", "arithmetic", *flags, "--tools", "[python]"])
    assert recipe.args.reward_funcs == [
        "last_integer",
        {"name": "soft_overlong", "params": {"cache_length": 4}},
    ]
    assert recipe.args.tools == ["python"]
    with pytest.raises(RecipeError, match=r"reward_funcs: cannot parse '\[a, \{' as a list"):
        load_recipe(None, ["--dataset.name", "arithmetic", "--reward_funcs", "[a, {"])


@pytest.mark.parametrize(
    ("lora", "message"),
    [("{r: 4, target_modules: [q_proj, lm_head]}", "adapter on lm_head"),
     ("{r: 4}", "needs liger-kernel")],
)  # fmt: skip
def test_use_liger_kernel_is_refused_in_one_line_before_anything_loads(tmp_path, lora, message):
    path = _write(tmp_path, f"dataset: {{name: arithmetic}}\nlora: {lora}\n"
                            "use_liger_kernel: true\noutput_dir: out\n")  # fmt: skip
    with pytest.raises(RecipeError, match=message):
        check_recipe(load_recipe(path))


def test_the_code_recipe_trains_on_generated_functions_and_holds_out_their_templates():
    from grpo_plugin.app.splits import load_splits

    recipe = load_recipe(ROOT / "recipes" / "code.yaml")
    args = recipe.args
    assert args.model == "embedded:smollm2-135m-instruct" and args.lora["r"] == 16
    assert args.reward_funcs[0]["name"] == "code_tests"
    assert args.reward_funcs[0]["params"]["isolation"] == "strict"  # never the rlimits level
    splits = load_splits(args.dataset)
    templates = [set(split["template"]) for split in (splits.train, splits.test, splits.validation)]
    assert not templates[0] & templates[1] and not templates[0] & templates[2]
    assert len(splits.test) == args.dataset["eval_size"]


def test_humaneval_is_refused_as_training_data_in_one_line():
    recipe = load_recipe(ROOT / "recipes" / "code.yaml", ["--dataset", "{name: humaneval}"])
    with pytest.raises(RecipeError, match=r"humaneval is an evaluation set.*grpo-plugin eval"):
        check_recipe(recipe)
