"""The recipe pipeline through the CLI and through `run_recipe`, on a tiny model: every output
file, the datasets named in grpo_run.json and the card, built-in recipes by name, and evaluations
on a schedule (metrics.jsonl, eval.json's curve, the summary lines and the card)."""

from __future__ import annotations

import json

import pytest
import yaml
from huggingface_hub import ModelCard

from grpo_plugin import cli, run_recipe
from grpo_plugin.app import pipeline, splits
from grpo_plugin.app.data import arithmetic_dataset
from grpo_plugin.app.recipe import RecipeError, load_recipe
from grpo_plugin.app.recipe_checks import check_recipe
from grpo_plugin.app.recipe_library import builtin_recipes, find_recipe, purpose
from grpo_plugin.evaluation.curve import wilson_interval

TINY_RECIPE = (
    "model: {model}\n"
    "dataset: {dataset}\n"
    "reward_funcs: [last_integer]\n"
    "eval: {{k: 0, batch_size: 8}}\n"
    "num_generations: 4\nper_device_train_batch_size: 8\nmax_steps: 1\nmax_completion_length: 4\n"
    "save_strategy: 'no'\ndisable_tqdm: true\noutput_dir: {out}\n"
)


def write_recipe(tmp_path, model_dir, dataset="{name: arithmetic, train_size: 8, eval_size: 4}"):
    path = tmp_path / "tiny.yaml"
    out = tmp_path / "out"
    path.write_text(TINY_RECIPE.format(model=model_dir, dataset=dataset, out=out))
    return path, out


def test_cli_names_hub_datasets_in_the_run_summary_and_the_card(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    """The bug the seams hid: the CLI set `trainer.dataset_names`, the summary read `args`."""
    loaded = []

    def local_stand_in(spec):  # {name: gsm8k} would read openai/gsm8k from the Hub
        loaded.append(spec)
        return arithmetic_dataset(8, 4)

    monkeypatch.setattr(splits, "load_prompt_datasets", local_stand_in)
    path, out = write_recipe(tmp_path, tiny_model_dir, dataset="{name: gsm8k}")
    assert cli.main(["train", str(path)]) == 0
    assert loaded == [{"name": "gsm8k"}]
    assert json.loads((out / "grpo_run.json").read_text())["datasets"] == ["openai/gsm8k"]
    card = ModelCard.load(out / "README.md")
    assert card.data.datasets == ["openai/gsm8k"]
    assert "Training prompts: `openai/gsm8k`" in card.text
    printed = capsys.readouterr().out
    assert "Held-out greedy accuracy" in printed
    # the end names what to look at and how to talk to the model, with a question of its data
    assert f"Report (open it in a browser): {out / 'report.html'}" in printed
    assert f"Talk to the model: grpo-plugin chat {out}" in printed
    assert f"One answer: grpo-plugin generate {out} 'What is " in printed


def test_run_recipe_writes_every_run_file(tiny_model_dir, tmp_path):
    path, out = write_recipe(tmp_path, tiny_model_dir)
    result = run_recipe(str(path), ["--seed", "3"])
    assert result["dataset"] == "arithmetic" and result["reward"] == "last_integer"
    assert result["before"]["n"] == result["after"]["n"] == 4
    names = ("grpo_run.json", "eval.json", "recipe.yaml", "reward_curve.png", "README.md")
    for name in (*names, "report.html"):
        assert (out / name).is_file(), name
    assert "seed: 3" in (out / "recipe.yaml").read_text()
    summary = json.loads((out / "grpo_run.json").read_text())
    assert summary["datasets"] == []  # local data
    assert summary["sampling"]["temperature"] == 1.0  # what `chat --sample` samples with
    assert summary["sampling"]["max_completion_length"] == 4


def test_a_hub_token_by_flag_or_environment_is_in_no_file_of_the_run(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    flag_token, env_token = "hf_FlagSecret0123456789", "hf_EnvSecret0123456789"
    monkeypatch.setenv("HF_TOKEN", env_token)
    path, out = write_recipe(tmp_path, tiny_model_dir)
    flags = ["--save_strategy", "steps", "--save_steps", "1", "--max_steps", "2"]
    assert cli.main(["train", str(path), *flags, "--hub_token", flag_token]) == 0
    assert (out / "checkpoint-2" / "training_args.bin").is_file()
    files = [p for p in out.rglob("*") if p.is_file()]
    leaked = [p for p in files for t in (flag_token, env_token) if t.encode() in p.read_bytes()]
    assert leaked == []
    recipe = (out / "recipe.yaml").read_text()
    assert "hub_token" not in yaml.safe_load(recipe)  # what publish uploads
    assert "# hub_token: given, not written" in recipe
    assert flag_token not in capsys.readouterr().out


def test_a_prompt_with_terminal_escapes_is_printed_with_them_shown(
    tiny_model_dir, tmp_path, capsys
):
    data = tmp_path / "data.jsonl"
    hostile = "What is 1 + 1?\x1b]0;TITLE\x07\x1b[2J\x1b]52;c;aGk=\x07"
    data.write_text(
        "".join(json.dumps({"prompt": hostile, "answer": "2"}) + "\n" for _ in range(8))
    )
    path, out = write_recipe(tmp_path, tiny_model_dir, dataset=f"{{path: {data}}}")
    assert cli.main(["train", str(path)]) == 0
    printed = capsys.readouterr()
    assert "\x1b" not in printed.out + printed.err and "\x07" not in printed.out + printed.err
    assert r"What is 1 + 1?\x1b]0;TITLE\x07" in printed.out  # the example for `generate`


def test_builtin_recipes_are_found_by_name_and_listed(capsys):
    recipes = builtin_recipes()
    assert {"arithmetic", "dapo", "gsm8k_gspo", "gsm8k_qlora"} <= set(recipes)
    assert find_recipe("arithmetic") == recipes["arithmetic"]
    assert purpose(recipes["arithmetic"]).startswith("THE DEMO")
    assert cli.main(["recipes"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed] == sorted(recipes)
    assert all(len(line.split(maxsplit=1)) == 2 for line in listed)  # every one has a purpose


def test_train_accepts_a_builtin_name(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # its output_dir is relative: not the demo's run in the clone
    assert cli.main(["train", "arithmetic", "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("arithmetic: OK (embedded:smollm2-135m-instruct")


def test_unknown_recipe_name_lists_the_builtins(capsys):
    assert cli.main(["train", "arithmetik"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "arithmetic" in err and "grpo-plugin recipes" in err


@pytest.mark.parametrize("name", sorted(builtin_recipes()))
def test_every_builtin_recipe_has_a_purpose_line(name):
    assert len(purpose(builtin_recipes()[name])) > 20


# ----------------------------------------------------------------------------- evaluation

EVAL_RECIPE = """
model: {model}
dataset: {{name: arithmetic, train_size: 8, eval_size: 6}}
reward_funcs: [last_integer]
eval: {{k: 0, batch_size: 8}}
eval_metrics: my_metrics.py:mean_chars
output_dir: {out}
max_steps: 5
eval_strategy: steps
eval_steps: 2
num_generations: 4
num_generations_eval: 4
per_device_train_batch_size: 8
per_device_eval_batch_size: 8
max_completion_length: 6
metric_for_best_model: accuracy
learning_rate: 1.0e-2
save_strategy: "no"
disable_tqdm: true
"""
HOOK = """
def mean_chars(prompts, completions, answer, **columns):
    return {"mean_chars": sum(len(c[0]["content"]) for c in completions) / len(completions)}
"""


@pytest.fixture(scope="module")
def run(tiny_model_dir, tmp_path_factory):
    """A 5-step recipe run evaluating at steps 2 and 4 with num_generations_eval 4."""
    root = tmp_path_factory.mktemp("pipeline")
    (root / "my_metrics.py").write_text(HOOK)  # next to the recipe, not in the working dir
    recipe = root / "recipe.yaml"
    recipe.write_text(EVAL_RECIPE.format(model=tiny_model_dir, out=root / "out"))
    return run_recipe(str(recipe)), root / "out"


def test_evaluations_are_logged_at_steps_2_4_and_the_end(run):
    _, out = run
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval_accuracy" in r]
    # every eval_steps = 2, and at the last step (the Trainer evaluates at the end of training)
    assert [r["step"] for r in evals] == [2, 4, 5]
    assert all("eval_pass@4" in r and r["eval_n"] == 6 for r in evals)
    assert all(isinstance(r["eval_mean_chars"], float) for r in evals)  # the recipe's hook


def test_eval_json_curve_holds_before_every_evaluation_and_after(run):
    evaluation, out = run
    saved = json.loads((out / "eval.json").read_text())
    curve = saved["curve"]
    assert [p["step"] for p in curve] == [0, 2, 4, 5]
    assert curve[0]["accuracy"] == saved["before"]["accuracy"]
    assert curve[-1]["accuracy"] == saved["after"]["accuracy"]
    for point in curve:
        assert point["n"] == 6
        low, high = wilson_interval(round(point["accuracy"] * 6), 6)
        assert point["ci95"] == [round(low, 4), round(high, 4)]
    assert saved["best_step"] in (2, 4)
    assert saved["best_metric"]["name"] == "eval_accuracy"
    assert evaluation["curve"] == curve


def test_summary_and_card_name_the_best_step(run):
    evaluation, out = run
    step = evaluation["best_step"]
    assert any(f"at step {step}" in line for line in pipeline.summary_lines(evaluation, out))
    card = (out / "README.md").read_text()
    assert f"**Best step: {step}** (eval_accuracy = " in card
    assert "| 2 |" in card and "| 4 |" in card  # the during-training table
    assert (out / "reward_curve.png").stat().st_size > 0


def _tree(folder):
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))}


def test_a_second_run_into_a_finished_run_says_so_and_changes_nothing(run, capsys):
    """Issue 56: a second `make demo` stopped with "holds a run with no complete checkpoint to
    resume from ... start over with --overwrite_output_dir" (exit 2), though the run there was
    finished and whole (`save_strategy: no` keeps no checkpoint)."""
    _, out = run
    recipe = out.parent / "recipe.yaml"
    before = _tree(out)
    for flags in ([], ["--dry-run"]):
        assert cli.main(["train", str(recipe), *flags]) == 0
        (line,) = capsys.readouterr().out.splitlines()
        assert line.startswith(f"{out} holds a finished run: 5 steps, held-out greedy accuracy ")
        assert "(n=6, last_integer). Nothing was changed." in line
        assert f"open {out / 'report.html'} in a browser" in line
        assert f"grpo-plugin chat {out}" in line
        assert "add --overwrite_output_dir (it replaces the run) or choose another" in line
        assert "--resume_from_checkpoint" not in line  # no checkpoint to go on from
    assert _tree(out) == before
    assert cli.main(["train", str(recipe), "--overwrite_output_dir", "--dry-run"]) == 0
    assert ": OK (" in capsys.readouterr().out  # training again is one flag away
    with pytest.raises(RecipeError, match="holds a finished run"):  # Python: nothing trained
        run_recipe(str(recipe))


HANGING_REWARD = """
import time


def hangs(prompts, completions, **kwargs):
    time.sleep(600)
"""


def test_a_hanging_reward_stops_before_step_1_with_one_line_naming_it(tiny_model_dir, tmp_path):
    """The bug the two evaluation engines hid: the before-training evaluation called the rewards
    without `reward_timeout`, so a hanging reward hung `grpo-plugin train` silently forever."""
    import os
    import subprocess
    import sys

    (tmp_path / "hang_reward.py").write_text(HANGING_REWARD)
    path, out = write_recipe(tmp_path, tiny_model_dir)
    path.write_text(path.read_text().replace("[last_integer]", "['hang_reward:hangs']"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "grpo_plugin", "train", str(path), "--reward_timeout", "2"]
    # the guard is the subprocess's own limit: without the fix this would run 600 s and fail here
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "'hangs' timed out" in last and "reward_timeout" in last, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    metrics = out / "metrics.jsonl"
    assert not metrics.exists() or '"loss"' not in metrics.read_text()  # no training step ran


VALIDATION_RECIPE = """
model: {model}
dataset: {{name: arithmetic, train_size: 8, eval_size: 3, validation_size: 5}}
reward_funcs: [last_integer]
eval: {{k: 2, batch_size: 8}}
output_dir: {out}
max_steps: 2
eval_strategy: steps
eval_steps: 1
num_generations: 4
num_generations_eval: 1
per_device_train_batch_size: 8
max_completion_length: 4
metric_for_best_model: accuracy
save_strategy: "no"
disable_tqdm: true
"""


def test_with_a_validation_split_training_evaluates_there_and_reports_on_test(
    tiny_model_dir, tmp_path
):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(VALIDATION_RECIPE.format(model=tiny_model_dir, out=tmp_path / "out"))
    evaluation = run_recipe(str(recipe))
    out = tmp_path / "out"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["eval_n"]) for r in rows if "eval_n" in r] == [(1, 5), (2, 5)]
    saved = json.loads((out / "eval.json").read_text())
    assert saved["splits"] == {"train": 8, "validation": 5, "test": 3}
    assert saved["before"]["n"] == saved["after"]["n"] == 3  # the reported numbers: test
    assert saved["validation_before"]["n"] == 5
    # pass@k on test, before and after; the validation split's step 0 is greedy only (the curve's)
    assert "pass@2" in saved["before"] and "pass@2" in saved["after"]
    assert not any(key.startswith("pass@") for key in saved["validation_before"])
    assert saved["curve_split"] == "validation"
    assert [(p["step"], p["n"]) for p in saved["curve"]] == [(0, 5), (1, 5), (2, 5)]
    assert saved["curve"][0]["accuracy"] == saved["validation_before"]["accuracy"]
    assert any("Best validation" in line for line in pipeline.summary_lines(evaluation, out))
    card = (out / "README.md").read_text()
    assert "validation split of 5 prompts" in card
    assert "Greedy validation accuracy at every evaluation" in card


def test_load_best_model_at_end_without_a_validation_split_is_refused(tiny_model_dir, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(EVAL_RECIPE.format(model=tiny_model_dir, out=tmp_path / "out"))
    (tmp_path / "my_metrics.py").write_text(HOOK)
    flags = ["--load_best_model_at_end", "true", "--save_strategy", "steps", "--save_steps", "2"]
    with pytest.raises(RecipeError, match="add `validation_size: N`"):
        check_recipe(load_recipe(str(recipe), flags))
    validated = ["--dataset.validation_size", "4", *flags]
    check_recipe(load_recipe(str(recipe), validated))  # with one, the same recipe passes


def test_a_run_that_takes_the_dir_after_the_checks_is_refused_in_one_line(tiny_model_dir, tmp_path):
    """The lock taken by another run between the checks and the claim: a RecipeError (the CLI's
    one line, on every process under accelerate), not OutputDirInUse's traceback."""
    from grpo_plugin.app.preflight import prepare_run
    from grpo_plugin.run.lock import RunLock

    path, out = write_recipe(tmp_path, tiny_model_dir)
    recipe = load_recipe(str(path))
    rewards = check_recipe(recipe)
    data = prepare_run(recipe, rewards)
    other = RunLock(out)
    other.acquire()
    try:
        with pytest.raises(RecipeError, match="is in use by another run"):
            pipeline.train_recipe(recipe, rewards, data)
    finally:
        other.release()
