"""Resumes that are not what they seem, through the Python API: a checkpoint with a missing piece
is refused (RNG state: a warning), a config that changes what the run is is refused unless
`resume_as_new_phase` (then recorded as a phase), a longer run or a new learning rate continues
the schedule as configured, and what the restored optimizer keeps is named."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch
from conftest import char_codes, make_trainer

from grpo_plugin.engine import cpu_threads

LOGGER = "grpo_plugin.run.resume"
RUN = dict(max_steps=4, save_strategy="steps", save_steps=2, learning_rate=3e-2)


def trainer_for(tokenizer, out, **overrides):
    return make_trainer(
        tokenizer,
        out.parent,
        char_codes,
        init_range=0.3,
        output_dir=str(out),
        **{**RUN, **overrides},
    )


def lines(out) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r]


@pytest.fixture(scope="module")
def finished(tiny_tokenizer, tmp_path_factory):
    """A 4-step run with checkpoint-2 and checkpoint-4 (the end of its linear decay)."""
    out = tmp_path_factory.mktemp("finished") / "out"
    trainer_for(tiny_tokenizer, out).train()
    return out


def copy_of(finished, tmp_path, drop_last: bool = True):
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    if drop_last:
        shutil.rmtree(out / "checkpoint-4")  # resume from checkpoint-2
    return out


@pytest.mark.parametrize("piece", ["optimizer.pt", "scheduler.pt", "grpo_state_0.pt"])
def test_a_checkpoint_missing_a_piece_is_refused_naming_it(
    tiny_tokenizer, finished, tmp_path, piece
):
    out = copy_of(finished, tmp_path, drop_last=False)
    (out / "checkpoint-4" / piece).unlink()
    before = (out / "metrics.jsonl").read_text()
    with pytest.raises(ValueError) as refused:
        trainer_for(tiny_tokenizer, out).train(resume_from_checkpoint=True)
    message = str(refused.value)
    assert f"checkpoint-4 has no {piece}, and an exact resume needs all of optimizer.pt" in message
    assert f"--resume_from_checkpoint {out / 'checkpoint-2'}" in message  # the earlier good one
    assert "--resume_as_new_phase true" in message and "\n" not in message
    assert (out / "metrics.jsonl").read_text() == before  # nothing saved is lost


def test_a_missing_optimizer_with_resume_as_new_phase_continues_the_schedule(
    tiny_tokenizer, finished, tmp_path, caplog
):
    out = copy_of(finished, tmp_path)
    (out / "checkpoint-2" / "optimizer.pt").unlink()
    resumed = trainer_for(tiny_tokenizer, out, resume_as_new_phase=True)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        resumed.train(resume_from_checkpoint=True)
    assert "continuing without them (not exactly)" in caplog.text
    # transformers alone restarted the schedule: step 3 at 0.03, as at step 1
    assert [r["learning_rate"] for r in lines(out)] == [r["learning_rate"] for r in lines(finished)]
    phases = resumed.run_summary()["phases"]
    assert phases[1] == {"phase": 2, "from_step": 2, "changed": {}, "missing": ["optimizer.pt"]}


def test_a_missing_rng_state_is_a_warning_and_the_resume_stays_exact(
    tiny_tokenizer, finished, tmp_path, caplog
):
    out = copy_of(finished, tmp_path)
    (out / "checkpoint-2" / "rng_state.pth").unlink()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        trainer_for(tiny_tokenizer, out).train(resume_from_checkpoint=True)
    assert "checkpoint-2 has no rng_state.pth" in caplog.text
    drop = ("timing/", "generation/tokens_per_s", "train_", "step_time")
    keep = [{k: v for k, v in r.items() if not k.startswith(drop)} for r in lines(out)]
    assert keep == [{k: v for k, v in r.items() if not k.startswith(drop)} for r in lines(finished)]


def test_a_changed_num_generations_is_refused_then_kept_as_a_second_phase(
    tiny_tokenizer, finished, tmp_path
):
    out = copy_of(finished, tmp_path)
    with pytest.raises(ValueError, match="trained with another config: num_generations 8 -> 4;"):
        trainer_for(tiny_tokenizer, out, num_generations=4).train(resume_from_checkpoint=True)
    resumed = trainer_for(tiny_tokenizer, out, num_generations=4, resume_as_new_phase=True)
    resumed.train(resume_from_checkpoint=True)
    resumed.save_model()
    phases = json.loads((out / "grpo_run.json").read_text())["phases"]
    assert json.loads((out / "checkpoint-4" / "grpo_run.json").read_text())["phases"] == phases
    assert phases == [
        {"phase": 1, "from_step": 0},
        {"phase": 2, "from_step": 2, "changed": {"num_generations": [8, 4]}},
    ]
    assert [r["step"] for r in lines(out)] == [1, 2, 3, 4]


def test_a_resume_that_turns_the_fast_paths_off_is_refused_as_another_run(
    tiny_tokenizer, finished, tmp_path
):
    """fast_paths changes the last bits of every forward, as padding_free does: not the run the
    checkpoint continues, unless recorded as a new phase."""
    out = copy_of(finished, tmp_path)
    with pytest.raises(ValueError, match="trained with another config: fast_paths True -> False;"):
        trainer_for(tiny_tokenizer, out, fast_paths=False).train(resume_from_checkpoint=True)


def test_raising_max_steps_after_the_end_continues_with_a_non_zero_learning_rate(
    tiny_tokenizer, finished, tmp_path, caplog
):
    out = copy_of(finished, tmp_path, drop_last=False)
    resumed = trainer_for(tiny_tokenizer, out, max_steps=6, save_steps=1, logging_steps=1)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        resumed.train(resume_from_checkpoint=True)
    lr = {r["step"]: r["learning_rate"] for r in lines(out)}
    assert lr[4] == pytest.approx(3e-2 / 4)  # the first phase's linear decay, unchanged
    assert lr[5] == pytest.approx(3e-2 * 2 / 6) and lr[6] == pytest.approx(3e-2 / 6)  # was 0.0
    assert (
        "max_steps 4 -> 6" in caplog.text and "step 5 trains at learning rate 0.01" in caplog.text
    )


def test_a_changed_learning_rate_is_honoured_and_named(tiny_tokenizer, finished, tmp_path, caplog):
    out = copy_of(finished, tmp_path)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        trainer_for(tiny_tokenizer, out, learning_rate=6e-2).train(resume_from_checkpoint=True)
    lr = [r["learning_rate"] for r in lines(out)]
    assert lr[:2] == [3e-2, 3e-2 * 3 / 4]
    assert lr[2:] == pytest.approx([6e-2 * 2 / 4, 6e-2 / 4])  # the restored scheduler kept 3e-2
    assert "learning_rate 0.03 -> 0.06" in caplog.text


def test_an_optimizer_hyperparameter_the_restored_optimizer_keeps_is_named(
    tiny_tokenizer, finished, tmp_path, caplog
):
    out = copy_of(finished, tmp_path)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        trainer_for(tiny_tokenizer, out, weight_decay=0.1).train(resume_from_checkpoint=True)
    assert "weight_decay 0.0 -> 0.1: not applied; the optimizer restored from" in caplog.text


def test_a_schedule_that_reaches_zero_before_the_end_is_named(caplog):
    """A scheduler built for the first 6 steps (a user's own, which no config change rebuilds),
    resumed at step 6 of a run raised to 8 steps: steps 7 and 8 would train at lr 0."""
    from types import SimpleNamespace

    import torch
    from transformers import get_linear_schedule_with_warmup

    from grpo_plugin.run.resume import SchedulePlan, rebuild_schedule

    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=0.03)
    scheduler = get_linear_schedule_with_warmup(optimizer, 0, 6)
    for _ in range(6):
        optimizer.step()
        scheduler.step()
    args = SimpleNamespace(max_steps=8, lr_scheduler_type="linear")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        rebuild_schedule(optimizer, scheduler, SchedulePlan(6, {"max_steps": (6, 8)}), args)
    assert "The linear learning-rate schedule is 0 at step(s) [7, 8] of max_steps=8" in caplog.text


def test_output_and_cadence_fields_are_free_to_change():
    from grpo_plugin.run.resume import compare

    saved = {"config": {"save_steps": 2, "logging_steps": 1, "output_dir": "a", "beta": 0.0}}
    moved = {"config": {"save_steps": 1, "logging_steps": 5, "output_dir": "b", "beta": 0.0}}
    assert compare(saved, moved).recorded() == {}
    changed = compare(saved, {"config": {**moved["config"], "beta": 0.1}})
    assert changed.refused == {"beta": (0.0, 0.1)}


def test_a_resume_onto_the_device_default_of_the_rollouts_is_a_change():
    """rollout_precision None (the default since 2026-12-06) samples from a bf16 copy on a CPU with
    bf16 units: a run started with 'policy' (the earlier default) is refused, not switched."""
    from grpo_plugin.run.resume import compare

    saved = {
        "config": {
            "rollout_precision": "policy",
            "compile_decode": None,
            "top_k": None,
            "epsilon_high": None,
        }
    }
    current = {"config": {"rollout_precision": None, "compile_decode": True, "top_k": None,
                          "epsilon_high": 0.28}}  # fmt: skip
    assert compare(saved, current).refused == {
        "compile_decode": (None, True),
        "epsilon_high": (None, 0.28),  # any config field's None is a value
        "rollout_precision": ("policy", None),
    }
    unknown = compare({"run": {"dataset": "8 rows, ab"}}, {"run": {"dataset": None}})
    assert unknown.recorded() == {}  # a streamed dataset's digest is not known: skipped


def test_a_checkpoint_of_an_older_version_resumes_with_a_warning(
    tiny_tokenizer, finished, tmp_path, caplog
):
    out = copy_of(finished, tmp_path)
    (out / "checkpoint-2" / "grpo_resume.json").unlink()  # written before the record existed
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        trainer_for(tiny_tokenizer, out, num_generations=4).train(resume_from_checkpoint=True)
    assert "checkpoint-2 has no grpo_resume.json (an older version wrote it)" in caplog.text


# --- torch_threads: the count a run trains with is kept by its resumes ------------------------------
THREADS_LOGGER = "grpo_plugin.engine.cpu_threads"


@pytest.fixture(scope="module")
def one_thread_run(tiny_tokenizer, tmp_path_factory):
    """The 4-step run at one torch thread."""
    before = torch.get_num_threads()
    out = tmp_path_factory.mktemp("one-thread") / "out"
    trainer_for(tiny_tokenizer, out, torch_threads=1).train()
    torch.set_num_threads(before)
    return out


def test_auto_resumes_with_the_thread_count_its_checkpoint_recorded(
    tiny_tokenizer, one_thread_run, tmp_path, monkeypatch, caplog
):
    record = json.loads((one_thread_run / "checkpoint-2" / "grpo_resume.json").read_text())
    assert record["torch_threads"] == 1
    out = copy_of(one_thread_run, tmp_path)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # set by the floors run: auto keeps it
    monkeypatch.setattr(cpu_threads, "free_cores", lambda: 2.0)  # the machine is idle now
    torch.set_num_threads(2)
    resumed = trainer_for(tiny_tokenizer, out, torch_threads="auto")
    assert torch.get_num_threads() == 2  # a fresh run would take both cores
    with caplog.at_level(logging.INFO, logger=THREADS_LOGGER):
        resumed.train(resume_from_checkpoint=True)
    assert torch.get_num_threads() == 1
    assert "torch threads: 1, as" in caplog.text
    same = ("loss", "reward", "grad_norm")  # bit for bit, as if never interrupted
    assert [[r[k] for k in same] for r in lines(out)] == [
        [r[k] for k in same] for r in lines(one_thread_run)
    ]
    record = json.loads((out / "checkpoint-4" / "grpo_resume.json").read_text())
    assert record["torch_threads"] == 1


def test_an_explicit_other_thread_count_on_resume_is_used_and_warned_about(
    tiny_tokenizer, one_thread_run, tmp_path, caplog
):
    out = copy_of(one_thread_run, tmp_path)
    resumed = trainer_for(tiny_tokenizer, out, torch_threads=2, max_steps=3)
    with caplog.at_level(logging.WARNING, logger=THREADS_LOGGER):
        resumed.train(resume_from_checkpoint=True)
    assert torch.get_num_threads() == 2
    assert "trained with 1 torch threads; this resume runs 2" in caplog.text
