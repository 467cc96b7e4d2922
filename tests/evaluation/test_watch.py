"""The reward-hacking alarm on scripted metrics, and the best step, from a log history."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from grpo_plugin.evaluation.watch import (
    EvalRecord,
    RewardHackingCallback,
    eval_records,
    find_divergence,
)

LOGGER = "grpo_plugin.evaluation.watch"


def _args(**overrides):
    base = dict(
        metric_for_best_model=None,
        greater_is_better=None,
        reward_hacking_window=2,
        reward_hacking_threshold=0.05,
        load_best_model_at_end=False,
    )
    return SimpleNamespace(**{**base, **overrides})


def _play(callback, args, rewards, evals, eval_every=2):
    """Feed a scripted run to the callback: one training log per step, an evaluation every
    `eval_every` steps. `rewards[i]` is the reward logged at step i + 1; `evals[j]` the metric of
    the j-th evaluation. Returns the state."""
    state = SimpleNamespace(log_history=[], global_step=0, best_model_checkpoint=None)
    for i, reward in enumerate(rewards):
        state.global_step = i + 1
        state.log_history.append({"step": i + 1, "loss": 0.0, "reward": reward})
        if state.global_step % eval_every == 0:
            metrics = {"eval_accuracy": evals[state.global_step // eval_every - 1]}
            state.log_history.append({"step": state.global_step, **metrics})
            callback.on_evaluate(args, state, None, metrics=metrics)
    return state


def _warnings(caplog):
    return [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


def test_reward_up_and_metric_down_warns_exactly_once(caplog):
    callback, args = RewardHackingCallback(), _args()
    rewards = [0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]  # evaluation windows: 0.25, 0.45, 0.65, 0.85
    accuracy = [0.80, 0.60, 0.40, 0.20]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        state = _play(callback, args, rewards, accuracy)
    warnings = _warnings(caplog)
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    # the first diverging pair: evaluations at steps 2 and 4
    assert "from step 2 to step 4" in message
    assert "rose from 0.250 to 0.450" in message
    assert "eval_accuracy went from 0.800 to 0.600" in message
    # every diverging window goes to the summary (for the card), the warning only once
    alarms = callback.summary(args, state)["alarms"]
    assert [(a["first_step"], a["last_step"]) for a in alarms] == [(2, 4), (4, 6), (6, 8)]


def test_both_rising_gives_no_warning(caplog):
    callback, args = RewardHackingCallback(), _args()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        state = _play(callback, args, [0.2, 0.3, 0.4, 0.5, 0.6, 0.7], [0.3, 0.5, 0.7])
    assert _warnings(caplog) == []
    assert callback.summary(args, state)["alarms"] == []


def test_changes_within_the_threshold_are_not_an_alarm(caplog):
    callback, args = RewardHackingCallback(), _args(reward_hacking_threshold=0.1)
    with caplog.at_level(logging.WARNING, logger=LOGGER):  # metric falls by only 0.05
        _play(callback, args, [0.2, 0.3, 0.5, 0.6], [0.70, 0.65])
    assert _warnings(caplog) == []


def test_window_of_three_compares_first_and_last():
    records = [EvalRecord(2, 0.8, 0.2), EvalRecord(4, 0.9, 0.3), EvalRecord(6, 0.6, 0.5)]
    found = find_divergence(records, "eval_accuracy", window=3, threshold=0.05)
    assert (found.first_step, found.last_step) == (2, 6)
    assert (found.metric_from, found.metric_to) == (0.8, 0.6)
    assert find_divergence(records[:2], "eval_accuracy", window=3) is None  # too few evaluations


def test_lower_is_better_metric_diverges_when_it_rises():
    records = [EvalRecord(2, 0.10, 0.2), EvalRecord(4, 0.30, 0.4)]
    assert find_divergence(records, "eval_loss", greater_is_better=False) is not None
    assert find_divergence(records, "eval_loss", greater_is_better=True) is None


def test_records_average_the_training_reward_since_the_previous_evaluation():
    history = [
        {"step": 0, "eval_accuracy": 0.4},  # eval_on_start: no training reward yet
        {"step": 1, "reward": 0.2},
        {"step": 2, "reward": 0.4},
        {"step": 2, "eval_accuracy": 0.5},
        {"step": 3, "reward": 1.0},
        {"step": 3, "eval_accuracy": 0.6},
    ]
    assert eval_records(history, "eval_accuracy") == [
        EvalRecord(0, 0.4, None),
        EvalRecord(2, 0.5, pytest.approx(0.3)),
        EvalRecord(3, 0.6, 1.0),
    ]


def test_summary_reports_the_best_step_of_metric_for_best_model():
    callback = RewardHackingCallback()
    args = _args(metric_for_best_model="accuracy", greater_is_better=True)
    state = _play(callback, args, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.5, 0.75, 0.625])
    summary = callback.summary(args, state)
    assert summary["metric"] == "eval_accuracy"
    assert (summary["best_step"], summary["best_metric"]) == (4, 0.75)
    assert summary["weights_step"] == 6  # no best checkpoint was restored
    state.best_model_checkpoint = "out/checkpoint-4"
    callback.on_train_end(_args(load_best_model_at_end=True), state, None)
    assert callback.summary(args, state)["weights_step"] == 4


def test_a_real_run_whose_reward_rises_while_its_task_metric_falls(
    tiny_tokenizer, tmp_path, caplog
):
    """Through the trainer: the warning once, the alarm in grpo_run.json and in the model card."""
    from conftest import SEVEN_DATA, make_tiny_model, tiny_config

    from grpo_plugin import GRPOTrainer
    from grpo_plugin.publish.card import write_model_card

    def rising(prompts, completions, trainer_state, **kw):
        return [trainer_state.global_step / 10 + (i % 2) / 100 for i in range(len(completions))]

    scores = iter([0.9, 0.8, 0.5, 0.2])  # before training would not count: evaluations 2, 4, 6

    def falling(prompts, completions, completion_ids, **columns):
        return {"score": next(scores)}

    args = tiny_config(tmp_path, max_steps=6, eval_strategy="steps", eval_steps=2,
                       metric_for_best_model="score")  # fmt: skip
    trainer = GRPOTrainer(make_tiny_model(tiny_tokenizer), rising, args=args,
                          train_dataset=SEVEN_DATA, eval_dataset=SEVEN_DATA[:2],
                          processing_class=tiny_tokenizer, eval_metrics=falling)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        trainer.train()
    assert len(_warnings(caplog)) == 1
    message = _warnings(caplog)[0].getMessage()
    assert "from step 2 to step 4 the mean training reward rose from 0.055 to 0.255" in message
    assert "eval_score went from 0.900 to 0.800" in message
    summary = trainer.run_summary()["evaluation"]
    assert summary["alarms"] and summary["alarms"][0]["last_step"] == 4
    trainer.save_model()
    card = write_model_card(tmp_path / "out").read_text()
    assert "> **Warning.**" in card
