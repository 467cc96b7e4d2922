"""grpo_plugin/app/recipe_eval.py: a recipe's evaluations before training, read back when an
identical one already ran (evaluation/known_results.py)."""

from __future__ import annotations

import json
import logging

import pytest

from grpo_plugin import run_recipe
from grpo_plugin.app.recipe import RecipeError
from grpo_plugin.evaluation import evaluator, known_results

RECIPE = """
model: {model}
dataset: {{name: arithmetic, train_size: 8, eval_size: 4, validation_size: 3}}
reward_funcs: [last_integer]
eval: {{k: 2, batch_size: 8{cache}}}
seed: {seed}
learning_rate: {lr}
num_generations: 4
per_device_train_batch_size: 8
max_steps: 1
max_completion_length: 4
save_strategy: "no"
disable_tqdm: true
output_dir: {out}
"""


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv(known_results.ENV, str(tmp_path / "evaluations"))
    return tmp_path / "evaluations"


@pytest.fixture
def counted(monkeypatch):
    """How many prompts the evaluator really decoded, per call."""
    calls: list[int] = []
    real = evaluator.evaluate

    def counting(model, tokenizer, dataset, *args, **kwargs):
        calls.append(len(dataset))
        return real(model, tokenizer, dataset, *args, **kwargs)

    monkeypatch.setattr(evaluator, "evaluate", counting)
    return calls


def run(tmp_path, model, name, seed=0, lr=1e-4, cache=""):
    path = tmp_path / f"{name}.yaml"
    out = tmp_path / name
    path.write_text(RECIPE.format(model=model, out=out, seed=seed, lr=lr, cache=cache))
    run_recipe(str(path))
    return json.loads((out / "eval.json").read_text())


def test_a_second_run_reads_the_evaluations_before_training(
    tiny_model_dir, tmp_path, store, counted, caplog
):
    first = run(tmp_path, tiny_model_dir, "first")
    assert counted == [4, 3, 4]  # test and validation before, test after
    assert len(list(store.glob("*.json"))) == 2  # the two before; never the trained model's
    counted.clear()
    with caplog.at_level(logging.INFO, logger="grpo_plugin.app.recipe_eval"):
        second = run(tmp_path, tiny_model_dir, "second", lr=3e-4)  # training settings differ
    assert counted == [4]  # only the evaluation after training ran
    assert second["before"] == first["before"] and "pass@2" in second["before"]
    assert second["validation_before"] == first["validation_before"]
    assert "the result of an identical earlier evaluation" in caplog.text


def test_another_seed_reuses_the_greedy_validation_and_samples_test_again(
    tiny_model_dir, tmp_path, store, counted
):
    run(tmp_path, tiny_model_dir, "first")
    counted.clear()
    run(tmp_path, tiny_model_dir, "second", seed=1)
    assert counted == [4, 4]  # test before (pass@2 samples by seed), after; validation known


def test_cache_false_evaluates_again(tiny_model_dir, tmp_path, store, counted):
    run(tmp_path, tiny_model_dir, "first")
    counted.clear()
    run(tmp_path, tiny_model_dir, "second", cache=", cache: false")
    assert counted == [4, 3, 4]


def test_cache_must_be_a_boolean(tiny_model_dir, tmp_path, store):
    with pytest.raises(RecipeError, match=r"eval.cache='yes' must be true or false"):
        run(tmp_path, tiny_model_dir, "bad", cache=", cache: 'yes'")
