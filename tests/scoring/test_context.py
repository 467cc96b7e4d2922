"""trainer_state, log_extra and log_metric reach reward functions as TRL 1.16 passes them; functions
that do not declare them keep working; all-None rewards are warned about."""

from __future__ import annotations

import logging

import pyarrow.parquet as pq
from conftest import SEVEN_DATA, frac_sevens, make_trainer

from grpo_plugin.scoring.context import RewardContext, declared_trainer_kwargs


def test_only_declared_trainer_kwargs_are_passed():
    def named(prompts, completions, trainer_state, **columns): ...
    def plain(prompts, completions, answer=None): ...
    def variadic(prompts, completions, **kwargs): ...

    assert declared_trainer_kwargs(named) == ("trainer_state", "log_extra", "log_metric")
    assert declared_trainer_kwargs(plain) == ()
    assert declared_trainer_kwargs(variadic) == ("trainer_state", "log_extra", "log_metric")

    def only_state(prompts, completions, trainer_state): ...

    context = RewardContext(lambda: "STATE")
    assert context.trainer_kwargs(only_state) == {"trainer_state": "STATE"}
    assert context.trainer_kwargs(plain) == {}
    assert set(context.trainer_kwargs(variadic)) == {"trainer_state", "log_extra", "log_metric"}

    context.log_metric("seen", 2.0)
    context.log_metric("seen", 4.0)
    assert context.pop_logged() == ({}, {"seen": 3.0})  # the mean of what was logged
    assert context.pop_metric_values() == {}  # then forgotten


def test_what_a_worker_logged_is_absorbed_as_if_logged_here():
    worker_side = RewardContext(lambda: None)
    worker_side.log_extra("length", [3, 4])
    worker_side.log_metric("seen", 1.0)
    here = RewardContext(lambda: None)
    here.log_metric("seen", 5.0)
    here.absorb(*worker_side.pop_raw())
    assert worker_side.pop_raw() == ({}, {})  # popped: sent once
    assert here.pop_logged() == ({"length": [3, 4]}, {"seen": 3.0})


def test_rewards_see_the_state_log_columns_and_metrics(tiny_tokenizer, tmp_path):
    def shaped(prompts, completions, trainer_state, log_extra, log_metric, **columns):
        # in the worker process: a list of this process would not see an append; the metric does
        log_metric("seen_step", float(trainer_state.global_step))
        log_extra("length", [len(c) for c in completions])
        log_metric("shaped/mean_length", sum(map(len, completions)) / len(completions))
        return frac_sevens(prompts, completions)

    trainer = make_trainer(tiny_tokenizer, tmp_path, reward=[shaped, frac_sevens], max_steps=2,
                           log_completions=True)  # fmt: skip
    trainer.train()
    seen = [h["seen_step"] for h in trainer.state.log_history if "seen_step" in h]
    assert seen == [0.0, 1.0]  # the live TrainerState, one call per rollout
    assert all("shaped/mean_length" in h for h in trainer.state.log_history[:2])
    table = pq.read_table(tmp_path / "out" / "completions" / "step_00001.parquet")
    assert table.column("length").to_pylist() == [
        len(c) for c in table.column("completion").to_pylist()
    ]


def test_all_none_rewards_are_warned_about(tiny_tokenizer, tmp_path, caplog):
    def never(prompts, completions, **kwargs):
        return [None] * len(completions)

    trainer = make_trainer(tiny_tokenizer, tmp_path, reward=never, max_steps=1)
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert "All reward functions returned None for the following kwargs:" in caplog.text
    assert "16 of 16 completions unscored" in caplog.text


def test_misaligned_extra_columns_are_left_out_with_a_warning(caplog):
    from grpo_plugin.scoring.context import aligned_extra_columns

    with caplog.at_level(logging.WARNING):
        kept = aligned_extra_columns({"ok": [1, 2], "short": [1]}, rows=2)
    assert kept == {"ok": [1, 2]}
    assert "log_extra column 'short' has 1 values for 2 completions" in caplog.text


def test_extra_columns_are_gathered_in_process_order_with_none_where_not_logged(monkeypatch):
    from grpo_plugin.scoring import context as reward_context

    # process 0 logged "a" for its 2 completions; process 1 logged "a" and "b" for its 3
    parts = [({"a": [1, 2]}, 2), ({"b": ["x", "y", "z"], "a": [3, 4, 5]}, 3)]
    monkeypatch.setattr(reward_context.distributed, "gather_objects", lambda acc, obj: parts)
    gathered = reward_context.gather_extra_columns(None, {"a": [1, 2]}, 2)
    assert gathered == {"a": [1, 2, 3, 4, 5], "b": [None, None, "x", "y", "z"]}
    assert list(gathered) == ["a", "b"]  # sorted, as every process must agree on the order
    monkeypatch.undo()
    assert reward_context.gather_extra_columns(None, {"c": [7]}, 1) == {"c": [7]}  # one process


def test_what_rewards_log_while_evaluating_goes_to_the_evaluation(tiny_tokenizer, tmp_path):
    def logging_reward(prompts, completions, log_extra, log_metric, **columns):
        log_extra("length", [len(c) for c in completions])
        log_metric("calls", 1.0)
        log_metric("batch", float(len(completions)))
        log_metric("n", -1.0)  # a clash with our own eval_n: ours wins
        return frac_sevens(prompts, completions)

    trainer = make_trainer(tiny_tokenizer, tmp_path, reward=logging_reward, max_steps=1,
                           eval_data=SEVEN_DATA[:3], num_generations_eval=1,
                           per_device_eval_batch_size=2, log_completions=True)  # fmt: skip
    metrics = trainer.evaluate()
    # 3 prompts in chunks of 2 and 1, greedy only: 2 calls, logging batch = 2 and batch = 1
    assert (metrics["eval_calls"], metrics["eval_batch"], metrics["eval_n"]) == (1.0, 1.5, 3)
    assert trainer.rewards.context.pop_logged() == ({}, {})  # nothing left for training
    trainer.train()
    table = pq.read_table(tmp_path / "out" / "completions" / "step_00000.parquet")
    assert table.column("length").to_pylist() == [
        len(c) for c in table.column("completion").to_pylist()
    ]
