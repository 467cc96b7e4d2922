"""Tests for grpo_plugin.training.autopilot: auto_find_batch_size keeps prompt groups whole."""

from __future__ import annotations

import logging
import mmap

import pytest
import torch
from conftest import make_trainer, tiny_config
from scripted_policy import multiply, multiply_script, scripted_llama
from transformers import TrainerState

from grpo_plugin import GRPOConfig, GRPOTrainer
from grpo_plugin.training import autopilot

GB = 2**30


def test_candidates_are_whole_groups_or_one_group_split_row_wise():
    assert autopilot.candidate_micro_batches(16, 16, 8) == [16, 8, 4, 2, 1]
    assert autopilot.candidate_micro_batches(24, 48, 8) == [24, 8, 4, 2, 1]  # not 12, 6 or 3
    assert autopilot.candidate_micro_batches(36, 72, 6) == [36, 18, 12, 6, 3, 2, 1]
    for m in autopilot.candidate_micro_batches(64, 128, 8):
        assert (m % 8 == 0 or 8 % m == 0) and 64 % m == 0


def _linear_probe(per_token_gb, calls, exceed=None):
    """A fake probe: 1 GB fixed + per_token_gb per token of the micro-batch (prompt 100 tokens
    per group, completion 10 per row); `exceed` rows measure 2x their prediction."""

    def probe(rows):
        calls.append(rows)
        tokens = -(-rows // 8) * 100 + rows * 10
        peak = (1.0 + per_token_gb * tokens) * GB
        return peak * 2 if rows == exceed else peak

    return probe


def test_the_largest_fitting_micro_batch_is_chosen_after_probing_it():
    calls = []
    # 1 + 0.01 * tokens: 1 row 2.1 GB, 8 rows 2.8, 16 rows 4.6, so 4 GB fits 8 rows, not 16
    m, probes = autopilot.choose_micro_batch(
        [16, 8, 4, 2, 1], _linear_probe(0.01, calls), 1.0 * GB, 4.0 * GB, 8, (100, 10)
    )
    assert m == 8 and calls == [1, 8]
    assert probes[8] == pytest.approx(2.8 * GB)


def test_a_probe_that_does_not_fit_steps_down_to_the_next_candidate():
    calls = []
    m, _ = autopilot.choose_micro_batch(
        [16, 8, 4, 2, 1], _linear_probe(0.01, calls, exceed=8), 1.0 * GB, 4.0 * GB, 8, (100, 10)
    )
    assert m == 4 and calls == [1, 8, 4]


def test_when_nothing_fits_the_smallest_is_kept():
    calls = []
    m, _ = autopilot.choose_micro_batch(
        [16, 8, 4, 2, 1], _linear_probe(0.5, calls), 1.0 * GB, 2.0 * GB, 8, (100, 10)
    )
    assert m == 1 and calls == [1]


def test_chunk_size_bounds_the_logits_memory():
    vocab = 49_152
    assert autopilot.chunk_size_for(20 * GB, vocab, 1024) == 1024  # 5% of 20 GB: > 1024 rows
    small = autopilot.chunk_size_for(1 * GB, vocab, 1024)  # 51 MB for 590 KB per position: 64
    assert small == 64 and small * vocab * 12 <= 0.05 * GB


def test_cpu_peak_memory_sees_a_large_allocation():
    cpu = torch.device("cpu")
    before = autopilot.memory_in_use(cpu)

    def touch_200_mb():  # fresh anonymous pages: an allocator's cache cannot hide them (a torch
        # tensor did, once, late in a full-suite run: its 200 MB came from retained memory)
        with mmap.mmap(-1, 200 * 2**20) as region:
            region[:: mmap.PAGESIZE] = b"\x01" * (len(region) // mmap.PAGESIZE)

    peak = autopilot.measure_peak(cpu, touch_200_mb)
    assert peak - before > 150e6
    assert autopilot.memory_available(cpu) > autopilot.memory_in_use(cpu)


def _rewards(trainer):
    return [h["reward"] for h in trainer.state.log_history if "reward" in h]


def test_trainer_applies_the_choice_and_samples_the_same_completions(
    tiny_tokenizer, tmp_path, monkeypatch, caplog
):
    """A budget (5 GB; the fake probes: ~0.5 GB held + 1 GB per row) that fits 4 rows: 16 rows
    per step become 4 micro-batches of 4, each group split row-wise in two; the first rollout
    (and so its reward) is the configured run's."""
    plain = make_trainer(tiny_tokenizer, tmp_path / "plain", max_steps=1)
    plain.train()
    calls = []

    def fake_probe(trainer, prompt, rows):
        calls.append(rows)
        return 0.5 * GB + rows * 1.0 * GB

    monkeypatch.setattr(autopilot, "_probe", fake_probe)
    # what the process holds before probing: fixed, so the choice does not depend on how much
    # memory the tests before this one left in the process
    monkeypatch.setattr(autopilot, "memory_in_use", lambda device: 0.5 * GB)
    trainer = make_trainer(
        tiny_tokenizer,
        tmp_path / "auto",
        max_steps=1,
        auto_find_batch_size=True,
        auto_batch_memory_gb=5.0,
    )
    with caplog.at_level(logging.INFO, logger="grpo_plugin"):
        trainer.train()
    a = trainer.args
    assert (a.per_device_train_batch_size, a.gradient_accumulation_steps) == (4, 4)
    assert a.steps_per_generation == 4 and a.generation_batch_size == 16
    assert trainer._share_group == 4 and not a.auto_find_batch_size
    assert calls[0] == 1 and 4 in calls
    lines = [r.getMessage() for r in caplog.records if "auto_find_batch_size" in r.getMessage()]
    assert len(lines) == 1 and "micro-batch 4 x 4 accumulation steps" in lines[0]
    assert _rewards(trainer) == pytest.approx(_rewards(plain), abs=1e-6)


def test_a_one_row_probe_leaves_the_prefix_sharing_warning_to_training(tiny_tokenizer, tmp_path):
    """A 1-row probe cannot share a prompt; it must not log (and so use up) the one-time warning
    that training fell back to the plain forward, which would then be wrong and never repeated."""
    from grpo_plugin import _logging

    trainer = make_trainer(tiny_tokenizer, tmp_path, auto_find_batch_size=True)
    _logging._warned.discard("train-share")
    autopilot._probe(trainer, autopilot.longest_prompt(trainer), 1)
    assert "train-share" not in _logging._warned
    assert trainer.args.share_prompt_prefix  # restored


def test_real_probe_runs_the_training_forward(tiny_tokenizer, tmp_path):
    trainer = make_trainer(tiny_tokenizer, tmp_path, auto_find_batch_size=True)
    prompt = autopilot.longest_prompt(trainer)
    assert len(prompt) == max(len(tiny_tokenizer(f"{i}+{i}=")["input_ids"]) for i in range(32))
    peak = autopilot._probe(trainer, prompt, 8)
    assert peak > 0
    assert all(p.grad is None for p in trainer.model.parameters())  # probes leave no gradients


TOOL_DATA = [
    {"prompt": [{"role": "user", "content": f"Multiply {a} and {b}"}], "answer": str(a * b)}
    for a, b in [(123, 45), (7, 8), (31, 9), (250, 12)]
]


def _exact_answer(completions, answer, **kwargs):
    return [float(c[-1]["content"] == f"It is {a}.") for c, a in zip(completions, answer)]


def _tool_trainer(tokenizer, tmp_path, **kw):
    options = dict(max_completion_length=200, num_generations=4, per_device_train_batch_size=8)
    return GRPOTrainer(
        scripted_llama(tokenizer, multiply_script),
        _exact_answer,
        args=tiny_config(tmp_path, **{**options, "max_steps": 1, **kw}),
        train_dataset=TOOL_DATA,
        processing_class=tokenizer,
        tools=[multiply],
    )


def test_a_multi_turn_tool_rollout_trains_with_one_group_split_row_wise(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Tools: the longest prompt is probed as the tool loop renders it (with the schemas); a
    2.5 GB budget (fake probes: 1 GB per row) fits 2 rows, so each group of 4 is split in two
    and the multi-turn rollout (its rewards) is the configured run's."""
    plain = _tool_trainer(tiny_tokenizer, tmp_path / "plain")
    plain.train()
    seen = []
    monkeypatch.setattr(autopilot, "memory_in_use", lambda device: 0.0)
    monkeypatch.setattr(autopilot, "_probe", lambda t, p, rows: seen.append(p) or rows * 1.0 * GB)
    trainer = _tool_trainer(
        tiny_tokenizer, tmp_path / "auto", auto_find_batch_size=True, auto_batch_memory_gb=2.5
    )
    trainer.train()
    a = trainer.args
    assert (a.per_device_train_batch_size, a.gradient_accumulation_steps) == (2, 4)
    assert (a.steps_per_generation, a.generation_batch_size, trainer._share_group) == (4, 8, 2)
    setup, schemas = trainer.tool_setup, [t.schema for t in trainer.tool_setup.tools]
    rendered = [
        setup.format.render_prompt(tiny_tokenizer, r["prompt"], schemas, None) for r in TOOL_DATA
    ]
    assert seen[0] == max(rendered, key=len)
    assert (
        _rewards(trainer) == pytest.approx(_rewards(plain), abs=1e-6)
        and _rewards(trainer)[0] == 1.0
    )


class _Env:
    def reset(self, **row):
        return None

    def add(self, amount: int) -> int:
        """Add.

        Args:
            amount: how much.
        """
        return amount


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"environment_factory": _Env}, "with environment_factory"),
        ({"rollout_func": lambda prompts, trainer: {}}, "with rollout_func"),
    ],
)
def test_what_the_autopilot_cannot_plan_is_refused_before_loading(
    tiny_tokenizer, tmp_path, extra, message
):
    args = tiny_config(tmp_path, num_generations=4, auto_find_batch_size=True)
    with pytest.raises(ValueError, match=f"auto_find_batch_size cannot probe a run {message}"):
        GRPOTrainer("not/loaded", None, args=args, train_dataset=TOOL_DATA, **extra)


def test_several_processes_are_refused_by_the_config(tmp_path, monkeypatch):
    monkeypatch.setattr(GRPOConfig, "world_size", property(lambda self: 2))
    with pytest.raises(ValueError, match="plans one process's memory, and this run has 2"):
        tiny_config(tmp_path, auto_find_batch_size=True)
    tiny_config(tmp_path)  # without the autopilot several processes are fine


def test_a_resumed_run_keeps_its_checkpoints_micro_batch(tiny_tokenizer, tmp_path, monkeypatch):
    checkpoint = tmp_path / "checkpoint-1"
    checkpoint.mkdir()
    TrainerState(train_batch_size=4).save_to_json(str(checkpoint / "trainer_state.json"))
    monkeypatch.setattr(autopilot, "_probe", lambda *a: pytest.fail("no probe on a resume"))
    trainer = make_trainer(tiny_tokenizer, tmp_path, auto_find_batch_size=True)
    chosen = autopilot.choose(trainer, str(checkpoint))
    trainer.plan_batch(str(checkpoint))  # the same choice, applied
    assert (chosen.micro_batch, chosen.gradient_accumulation_steps, chosen.probes) == (4, 4, {})
    assert trainer.args.per_device_train_batch_size == 4 and trainer._share_group == 4
