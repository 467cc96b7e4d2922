"""Tests for grpo_plugin.training.sampling.overlap: groups scored while later groups still decode."""

from __future__ import annotations

import threading

import pytest
import torch
from conftest import SEVEN_DATA, char_codes, make_tiny_model, make_trainer

import reward_fns
from grpo_plugin.training.sampling import overlap
from grpo_plugin.training.sampling.overlap import GroupWatch


def test_group_watch_queues_each_finished_group_once_with_its_tokens():
    watch = GroupWatch(group=2, rows=4)  # 2 groups of 2 rows
    tokens = [torch.tensor([5, 6, 7, 8])]
    live = [torch.tensor([True, True, True, True])]
    watch(torch.tensor([True, False, False, False]), tokens, live)
    assert watch.queue.empty()  # group 0 has one row still decoding
    tokens.append(torch.tensor([0, 9, 0, 3]))
    live.append(torch.tensor([False, True, True, True]))
    watch(torch.tensor([True, True, False, True]), tokens, live)
    p, ids, mask = watch.queue.get_nowait()
    assert p == 0 and ids.tolist() == [[5, 0], [6, 9]] and mask.tolist() == [[1, 0], [1, 1]]
    watch(torch.tensor([True, True, False, True]), tokens, live)
    assert watch.queue.empty()  # not queued twice
    watch.cancelled.set()
    with pytest.raises(overlap.DecodeCancelled):
        watch(torch.tensor([True, True, True, True]), tokens, live)


def _trainer(tiny_tokenizer, tmp_path, reward, **kw):
    model = make_tiny_model(tiny_tokenizer)
    model.generation_config.eos_token_id = list(range(5, 50))  # half the vocabulary ends a row:
    # groups end at different steps, most of them before max_completion_length
    return make_trainer(tiny_tokenizer, tmp_path, reward, model=model, max_completion_length=12,
                        **kw)  # fmt: skip


def _rows():
    return [dict(r) for r in SEVEN_DATA[:4]]


def test_overlapped_scoring_gives_the_rewards_of_scoring_after(tiny_tokenizer, tmp_path):
    seen_threads, group_sizes = set(), []

    @reward_fns.in_process  # it records into this process's memory
    def reward(prompts, completions, **kwargs):
        seen_threads.add(threading.current_thread().name)
        group_sizes.append(len(completions))
        return char_codes(prompts, completions)

    key = None
    results = {}
    for flag in (False, True):
        trainer = _trainer(tiny_tokenizer, tmp_path / str(flag), reward, overlap_scoring=flag)
        key = trainer._rollout_key if key is None else key
        results[flag] = trainer._sample_and_score(_rows(), key)
        metrics = dict(trainer._metrics.values)
        assert ("timing/reward_hidden_s" in metrics) is flag
    plain, overlapped = results[False], results[True]
    assert plain.completions == overlapped.completions  # the same draws, the same text
    torch.testing.assert_close(overlapped.per_func, plain.per_func, rtol=0, atol=0)
    torch.testing.assert_close(overlapped.rewards, plain.rewards, rtol=0, atol=0)
    assert seen_threads == {"MainThread"}  # rewards never leave the main thread
    assert group_sizes[0] == 32  # scored after: one call over 4 prompts x G=8
    assert group_sizes.count(8) >= 2 and sum(group_sizes[1:]) == 32  # groups scored as they end


def test_a_reward_that_raises_stops_the_decode_and_names_the_function(tiny_tokenizer, tmp_path):
    def broken(prompts, completions, **kwargs):
        raise ValueError("judge unreachable")

    trainer = _trainer(tiny_tokenizer, tmp_path, broken, overlap_scoring=True)
    with pytest.raises(Exception, match="judge unreachable"):
        trainer._sample_and_score(_rows(), trainer._rollout_key)
    assert not [t for t in threading.enumerate() if t.name == "grpo-decode"]  # joined


def test_a_run_with_overlap_scoring_trains(tiny_tokenizer, tmp_path):
    trainer = _trainer(tiny_tokenizer, tmp_path, char_codes, overlap_scoring=True, max_steps=2)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logged) == 2
    assert all(h["timing/reward_hidden_s"] >= 0 for h in logged)


def test_tools_and_rollout_func_are_refused_before_a_model_loads(tiny_tokenizer, tmp_path):
    from grpo_plugin import GRPOTrainer

    def rollout_func(prompts, trainer):
        raise AssertionError("never called")

    args = _trainer(tiny_tokenizer, tmp_path, char_codes).args
    args.overlap_scoring = True
    with pytest.raises(ValueError, match="overlap_scoring .* has rollout_func; set"):
        GRPOTrainer("no-such-model", char_codes, args=args, train_dataset=SEVEN_DATA,
                    rollout_func=rollout_func)  # fmt: skip
