"""Bad evaluation setups fail with one line before any model loads (the policy loader is replaced
by one that fails the test)."""

from __future__ import annotations

import pytest
from conftest import SEVEN_DATA, frac_sevens, tiny_config
from datasets import Dataset

from grpo_plugin import GRPOTrainer
from grpo_plugin.evaluation.setup import (
    check_eval_setup,
    check_metrics_result,
    resolve_eval_metrics,
)


@pytest.fixture
def model_never_loads(monkeypatch, tiny_model_dir):
    """A real model directory, whose loading fails the test."""

    def loaded(*args, **kwargs):
        raise AssertionError("the model was loaded: the check should have come first")

    monkeypatch.setattr("grpo_plugin.training.trainer.load_trainer_policy", loaded)
    return str(tiny_model_dir)


def _build(model_dir, tmp_path, eval_dataset=None, eval_metrics=None, **config):
    return GRPOTrainer(
        model_dir,
        frac_sevens,
        args=tiny_config(tmp_path, **config),
        train_dataset=SEVEN_DATA,
        eval_dataset=eval_dataset,
        eval_metrics=eval_metrics,
    )


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (dict(eval_strategy="steps", eval_steps=2), "eval_strategy='steps' evaluates on a held-out"),
        (dict(eval_on_start=True), "eval_on_start evaluates on a held-out set, but there is none"),
        (
            dict(eval_dataset=SEVEN_DATA[:2], eval_metrics="no_such_module_xyz:f1"),
            "cannot import 'no_such_module_xyz'",
        ),
        (dict(eval_dataset=SEVEN_DATA[:2], eval_metrics="json:no_such_fn"), "has no function"),
        (dict(eval_dataset=SEVEN_DATA[:2], eval_metrics="f1"), "must be 'module:function'"),
        (
            dict(
                eval_dataset=SEVEN_DATA[:2],
                eval_strategy="steps",
                eval_steps=2,
                metric_for_best_model="f1",
            ),
            "metric_for_best_model='f1' is never logged (as 'eval_f1')",
        ),
        (dict(eval_dataset=[{"question": "x"}]), "eval_dataset has no 'prompt' column"),
        (dict(eval_dataset=Dataset.from_dict({"prompt": []})), "eval_dataset is empty"),
        (dict(eval_dataset={}), "empty dict"),
        (dict(eval_dataset={"a": [{"q": "x"}]}), "eval_dataset['a'] has no 'prompt' column"),
    ],
    ids=[
        "steps-no-set", "on-start-no-set", "hook-module", "hook-attr", "hook-format",
        "best-metric", "no-prompt", "empty", "empty-dict", "named-no-prompt",
    ],
)  # fmt: skip
def test_bad_setups_fail_before_the_model_loads(model_never_loads, tmp_path, setup, message):
    with pytest.raises(ValueError) as err:
        _build(model_never_loads, tmp_path, **setup)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def _args(tmp_path, **overrides):
    return tiny_config(tmp_path, eval_strategy="steps", eval_steps=2, **overrides)


def test_logged_metrics_are_accepted_for_the_best_model(tmp_path):
    names = ["frac_sevens"]
    for metric in ("accuracy", "eval_pass@8", "rewards/frac_sevens/mean", "loss"):
        check_eval_setup(_args(tmp_path, metric_for_best_model=metric), [""], names, False)
    args = _args(tmp_path, metric_for_best_model="eval_math_accuracy")
    check_eval_setup(args, ["math", "code"], names, False)
    with pytest.raises(ValueError, match="eval_math_accuracy"):  # the hint names the real keys
        check_eval_setup(_args(tmp_path, metric_for_best_model="accuracy"), ["math"], names, False)
    with pytest.raises(ValueError, match="never logged"):  # pass@k needs num_generations_eval > 1
        args = _args(tmp_path, metric_for_best_model="pass@8", num_generations_eval=1)
        check_eval_setup(args, [""], names, False)
    # a hook may log it: checked at the first evaluation instead
    check_eval_setup(_args(tmp_path, metric_for_best_model="f1"), [""], names, True)


def test_load_best_model_at_end_defaults_to_accuracy_not_loss(tmp_path):
    args = tiny_config(
        tmp_path, eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2,
        load_best_model_at_end=True,
    )  # fmt: skip
    assert args.metric_for_best_model == "accuracy" and args.greater_is_better is True


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (dict(num_generations_eval=0), "num_generations_eval=0 must be >= 1"),
        (dict(reward_hacking_window=1), "reward_hacking_window=1 must be >= 2"),
    ],
)
def test_evaluation_fields_are_checked_in_the_config(tmp_path, config, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(tmp_path, **config)


def test_hook_results_are_checked():
    def hook(**kw):
        return {}

    assert check_metrics_result({"f1": 1, "ok": True}, hook) == {"f1": 1.0, "ok": 1.0}
    with pytest.raises(TypeError, match="returned list"):
        check_metrics_result([0.5], hook)
    with pytest.raises(ValueError, match="'accuracy', which is not a string or is already logged"):
        check_metrics_result({"accuracy": 0.5}, hook)
    with pytest.raises(TypeError, match="returned 'high' for 'f1'"):
        check_metrics_result({"f1": "high"}, hook)


def test_hook_file_paths_resolve_relative_to_a_base_dir(tmp_path):
    (tmp_path / "metrics.py").write_text("def f1(**kw):\n    return {'f1': 1.0}\n")
    assert resolve_eval_metrics("metrics.py:f1", base_dir=tmp_path)() == {"f1": 1.0}
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ValueError, match="RuntimeError: boom"):
        resolve_eval_metrics("broken.py:f1", base_dir=tmp_path)


def test_steps_without_eval_steps_warns_that_every_step_is_evaluated(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="grpo_plugin.config.grpo_config"):
        tiny_config(tmp_path, eval_strategy="steps")
        tiny_config(tmp_path, eval_strategy="steps", eval_steps=4)
    assert [r.getMessage() for r in caplog.records] == [
        "eval_strategy='steps' without eval_steps evaluates at every logging step (every 1 "
        "steps); set eval_steps, e.g. eval_steps=16."
    ]
