"""Runs you can trust, through the Python API: a crashed or signalled run resumes exactly, a
rerun into a used directory is refused, and a non-finite loss stops before the weights change."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal

import pytest
import torch
from conftest import SEVEN_DATA, CrashAt, char_codes, make_tiny_model, tiny_config, tiny_lora
from safetensors.torch import load_file
from transformers import TrainerCallback

from grpo_plugin import GRPOTrainer
from grpo_plugin.run.guards import NonFiniteError, check_advantages
from grpo_plugin.run.preemption import TrainingInterrupted

# A rollout of 24 completions trained on in 3 micro-steps, twice (mu = 2): checkpoint-2 falls in
# the middle of the first rollout, so resuming needs the rollout buffer from the checkpoint.
REUSED = dict(
    per_device_train_batch_size=8,
    num_generations=4,
    steps_per_generation=3,
    num_iterations=2,
    max_steps=5,
    save_strategy="steps",
    save_steps=2,
)
# Wall-clock metrics, and the end-of-run summary, which (as in transformers) describes the part
# of the run since it was last started.
NOT_COMPARED = ("timing/", "generation/tokens_per_s", "train_", "step_time")


def trainer_for(tokenizer, out, callbacks=None, reward=char_codes, **overrides):
    args = tiny_config(out.parent, output_dir=str(out), **{**REUSED, **overrides})
    return GRPOTrainer(
        make_tiny_model(tokenizer, initializer_range=0.3),
        reward,
        args=args,
        train_dataset=SEVEN_DATA,
        processing_class=tokenizer,
        peft_config=tiny_lora(),
        callbacks=callbacks,
    )


def adapter(trainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in trainer.model.state_dict().items() if "lora_" in k}


def metric_lines(out) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(NOT_COMPARED)} for r in rows]


class SignalAt(TrainerCallback):
    """Sends this process SIGTERM (as a spot-instance preemption would) while step `step` + 1
    runs."""

    def __init__(self, step: int):
        self.step = step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.fixture(scope="module")
def uninterrupted(tiny_tokenizer, tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted") / "out"
    trainer = trainer_for(tiny_tokenizer, out)
    trainer.train()
    return adapter(trainer), metric_lines(out)


def test_a_crashed_run_resumes_exactly(tiny_tokenizer, tmp_path, uninterrupted):
    out = tmp_path / "out"
    with pytest.raises(SystemExit):
        trainer_for(tiny_tokenizer, out, [CrashAt(3)]).train()
    assert [p.name for p in sorted(out.glob("checkpoint-*"))] == ["checkpoint-2"]
    resumed = trainer_for(tiny_tokenizer, out)
    resumed.train(resume_from_checkpoint=True)
    weights, lines = uninterrupted
    diff = max((adapter(resumed)[k] - weights[k]).abs().max().item() for k in weights)
    assert diff == 0.0
    assert metric_lines(out) == lines  # steps 1..5 once each, the same values
    assert [r["step"] for r in lines if "loss" in r] == [1, 2, 3, 4, 5]


def test_a_run_sampled_by_a_bf16_copy_resumes_exactly_mid_rollout(tiny_tokenizer, tmp_path):
    # checkpoint-2 is mid-rollout: the buffer must keep the copy's sampling log-probs
    whole = trainer_for(tiny_tokenizer, tmp_path / "whole", rollout_precision="bf16")
    whole.train()
    out = tmp_path / "out"
    with pytest.raises(SystemExit):
        trainer_for(tiny_tokenizer, out, [CrashAt(3)], rollout_precision="bf16").train()
    resumed = trainer_for(tiny_tokenizer, out, rollout_precision="bf16")
    resumed.train(resume_from_checkpoint=True)
    weights = adapter(whole)
    assert max((adapter(resumed)[k] - weights[k]).abs().max().item() for k in weights) == 0.0
    lines = metric_lines(out)
    assert lines == metric_lines(tmp_path / "whole")
    assert all("sampling/importance_sampling_ratio/mean" in r for r in lines if "loss" in r)


def test_sigterm_saves_a_checkpoint_and_the_run_resumes_exactly(
    tiny_tokenizer, tmp_path, uninterrupted
):
    out = tmp_path / "out"
    with pytest.raises(TrainingInterrupted) as stopped:
        trainer_for(tiny_tokenizer, out, [SignalAt(3)]).train()
    assert stopped.value.exit_code == 143 and stopped.value.step == 4  # step 4 was finished
    assert stopped.value.checkpoint == str(out / "checkpoint-4")  # mid-rollout: 4 of its 6 steps
    assert "--resume_from_checkpoint true" in str(stopped.value)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored
    resumed = trainer_for(tiny_tokenizer, out)
    resumed.train(resume_from_checkpoint=True)
    weights, lines = uninterrupted
    assert max((adapter(resumed)[k] - weights[k]).abs().max().item() for k in weights) == 0.0
    assert metric_lines(out) == lines


def test_resuming_from_the_last_checkpoint_trains_no_further_step(
    tiny_tokenizer, tmp_path, uninterrupted, caplog
):
    """SIGTERM during the last step: checkpoint-5 is the end of the run; resuming it (twice)
    trains nothing (transformers alone trained a step 6, then 7)."""
    out = tmp_path / "out"
    with pytest.raises(TrainingInterrupted) as stopped:
        trainer_for(tiny_tokenizer, out, [SignalAt(4)]).train()
    assert stopped.value.step == 5 and stopped.value.checkpoint == str(out / "checkpoint-5")
    weights, lines = uninterrupted
    for _ in range(2):
        resumed = trainer_for(tiny_tokenizer, out)
        with caplog.at_level(logging.WARNING, logger="grpo_plugin.run.lifecycle"):
            resumed.train(resume_from_checkpoint=True)
        assert resumed.state.global_step == 5
        assert max((adapter(resumed)[k] - weights[k]).abs().max().item() for k in weights) == 0.0
        assert [r["step"] for r in metric_lines(out) if "loss" in r] == [1, 2, 3, 4, 5]
    assert "checkpoint is at step 5 and max_steps=5: nothing is left to train" in caplog.text
    assert [p.name for p in sorted(out.glob("checkpoint-*"))][-1] == "checkpoint-5"


def test_evaluate_then_train_works_but_a_rerun_is_refused(tiny_tokenizer, tmp_path):
    out = tmp_path / "out"
    first = trainer_for(tiny_tokenizer, out, max_steps=1, save_strategy="no")
    first.evaluate(SEVEN_DATA[:2])  # writes metrics.jsonl: this trainer's own line
    first.train()
    again = trainer_for(tiny_tokenizer, out, max_steps=1, save_strategy="no")
    with pytest.raises(ValueError, match="holds a run"):
        again.train()
    clean = trainer_for(
        tiny_tokenizer, out, max_steps=1, save_strategy="no", overwrite_output_dir=True
    )
    clean.train()
    assert [r["step"] for r in metric_lines(out) if "loss" in r] == [1]  # the old lines are gone


def test_a_non_finite_loss_stops_before_the_weights_change(tiny_tokenizer, tmp_path):
    out = tmp_path / "out"
    trainer = trainer_for(tiny_tokenizer, out, num_iterations=1, steps_per_generation=1)
    objective = trainer.training_objective

    class PoisonAtStep3:
        def __getattr__(self, name):
            return getattr(objective, name)

        def __call__(self, *args, **kwargs):
            loss, metrics = objective(*args, **kwargs)
            return (loss * torch.nan if trainer.state.global_step == 2 else loss), metrics

    trainer.training_objective = PoisonAtStep3()
    with pytest.raises(NonFiniteError, match="step 3: the loss is nan; stopping before"):
        trainer.train()
    assert [p.name for p in out.glob("checkpoint-*")] == ["checkpoint-2"]
    assert trainer.state.global_step == 2  # the optimizer never stepped on the NaN loss
    assert all(torch.isfinite(v).all() for v in adapter(trainer).values())
    on_disk = load_file(out / "checkpoint-2" / "adapter_model.safetensors")
    assert all(torch.isfinite(v).all() for v in on_disk.values())


def test_huge_rewards_that_overflow_the_group_statistics_stop_the_run(tiny_tokenizer, tmp_path):
    def huge(prompts, completions, **kw):  # each finite, but a group's sum overflows float32
        return [3.0e38 * (i % 4 > 0) for i in range(len(completions))]

    out = tmp_path / "out"
    trainer = trainer_for(tiny_tokenizer, out, reward=huge, max_steps=1, scale_rewards="none")
    with pytest.raises(NonFiniteError, match="step 1: the loss is inf; stopping before"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_non_finite_advantages_name_the_largest_reward():
    rewards = torch.tensor([0.0, 3.0e38, 3.0e38, 3.0e38])
    with pytest.raises(
        NonFiniteError, match=r"step 8: the advantages .* \(largest \|reward\| 3e\+38\)"
    ):
        check_advantages(rewards - rewards.sum(), rewards, 7)  # float32 sum overflows: -inf


def _tables(out) -> list[str]:
    return sorted(p.name for p in (out / "completions").iterdir())


@pytest.fixture(scope="module")
def finished_run(tiny_tokenizer, tmp_path_factory):
    """The 5-step run of `uninterrupted`, with completions: checkpoints 2, 4 and 5."""
    out = tmp_path_factory.mktemp("finished") / "out"
    trainer_for(tiny_tokenizer, out, log_completions=True).train()
    return out


def test_a_resume_that_fails_to_load_changes_nothing(tiny_tokenizer, tmp_path, finished_run):
    """optimizer.pt whole (its checksums hold) but not this run's: the Trainer fails to load it.
    The records after checkpoint-4 were cut before the load (steps lost for good); now the run
    folder is touched only once the checkpoint is loaded."""
    out = tmp_path / "out"
    shutil.copytree(finished_run, out)
    shutil.rmtree(out / "checkpoint-5")
    torch.save({"state": {}, "param_groups": []}, out / "checkpoint-4" / "optimizer.pt")
    before = (out / "metrics.jsonl").read_text(), _tables(out)
    with pytest.raises(ValueError, match="parameter group"):
        trainer_for(tiny_tokenizer, out, log_completions=True).train(resume_from_checkpoint=True)
    assert ((out / "metrics.jsonl").read_text(), _tables(out)) == before
    assert not (out / "abandoned").exists()


def test_true_never_resumes_an_abandoned_timeline(tiny_tokenizer, tmp_path, finished_run):
    """Resume from checkpoint-2 to step 3 with another learning rate, then resume with `True`:
    it continues the new timeline from checkpoint-3, not the old one's checkpoint-5."""
    out = tmp_path / "out"
    shutil.copytree(finished_run, out)
    branch = trainer_for(tiny_tokenizer, out, log_completions=True, max_steps=3, learning_rate=1e-2)
    branch.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    assert [p.name for p in sorted(out.glob("checkpoint-*"))] == ["checkpoint-2", "checkpoint-3"]
    (aside,) = (out / "abandoned").iterdir()
    assert sorted(p.name for p in aside.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-5"]
    new_step_3 = [r for r in metric_lines(out) if r["step"] == 3 and "loss" in r]
    resumed = trainer_for(tiny_tokenizer, out, log_completions=True, learning_rate=1e-2)
    resumed.train(resume_from_checkpoint=True)
    rows = [r for r in metric_lines(out) if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]  # one continuous history
    assert [r for r in rows if r["step"] == 3] == new_step_3  # the new timeline's step 3
    assert [r["step"] for r in metric_lines(aside) if "loss" in r] == [3, 4, 5]  # kept aside
    assert _tables(out) == _tables(finished_run)  # one rollout per 6 steps here: step 0's


def test_the_training_time_counts_the_whole_run(tiny_tokenizer, tmp_path, finished_run):
    out = tmp_path / "out"
    shutil.copytree(finished_run, out)
    shutil.rmtree(out / "checkpoint-4")
    shutil.rmtree(out / "checkpoint-5")
    record = json.loads((out / "checkpoint-2" / "grpo_resume.json").read_text())
    assert record["train_seconds"] > 0  # each checkpoint records the time trained up to it
    record["train_seconds"] = 1000.0  # as if steps 1-2 had taken that long
    (out / "checkpoint-2" / "grpo_resume.json").write_text(json.dumps(record))
    resumed = trainer_for(tiny_tokenizer, out, log_completions=True)
    resumed.train(resume_from_checkpoint=True)
    assert 1000.0 < resumed.resume_plan.train_seconds < 1000.0 + 3600
    saved = json.loads((out / "checkpoint-5" / "grpo_resume.json").read_text())
    assert 1000.0 < saved["train_seconds"] <= resumed.resume_plan.train_seconds
