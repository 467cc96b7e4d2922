"""One timeline per run folder: a resume from checkpoint-k moves what came after step k into
`abandoned/`, never deletes it, and leaves metrics.jsonl one continuous history."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch
from safetensors.torch import save_file

from grpo_plugin.run import checkpoints, lock, rundir, timeline


def _finished_run(out, steps=5, saves=(2, 4, 5)):
    """A run folder as a 5-step run leaves it: checkpoints, metrics, tables, final outputs."""
    out.mkdir()
    lines = [{"step": s, "loss": 0.1 * s} for s in range(1, steps + 1)]
    lines.append({"step": steps, "train_runtime": 9.0})  # the end-of-training summary
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (out / "completions").mkdir()
    for s in range(steps):
        (out / "completions" / f"step_{s:05d}.parquet").write_bytes(b"table %d" % s)
    for s in saves:
        (out / f"checkpoint-{s}").mkdir()
        (out / f"checkpoint-{s}" / "trainer_state.json").write_text("{}")
    (out / "grpo_run.json").write_text(json.dumps({"global_step": steps}))
    (out / "adapter_model.safetensors").write_bytes(b"step-5 weights")
    (out / "README.md").write_text("card")
    before = {"before": {"accuracy": 0.1}, "dataset": "arithmetic"}
    (out / "eval.json").write_text(json.dumps(before | {"after": {"accuracy": 0.5}}))
    (out / ".checkpoint-staging").mkdir()  # a kill while saving


def _steps(path):
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_a_resume_from_an_earlier_checkpoint_sets_the_later_timeline_aside(tmp_path, caplog):
    out = tmp_path / "run"
    _finished_run(out)
    with caplog.at_level(logging.WARNING):
        aside = timeline.set_aside(out, 2)
    assert aside.parent == out / "abandoned" and aside.name.startswith("after-step-2-")
    # the run folder: steps 1-2 only, one timeline
    assert [p.name for p in checkpoints.checkpoints(out)] == ["checkpoint-2"]
    assert _steps(out / "metrics.jsonl") == [1, 2]
    assert sorted(p.name for p in (out / "completions").iterdir()) == [
        "step_00000.parquet",
        "step_00001.parquet",
    ]  # tables sampled at steps 0 and 1 trained steps 1 and 2
    assert json.loads((out / "eval.json").read_text()) == {
        "before": {"accuracy": 0.1},
        "dataset": "arithmetic",
    }  # the evaluation before training is both timelines'
    assert not (out / "adapter_model.safetensors").exists() and not (out / "README.md").exists()
    assert not (out / ".checkpoint-staging").exists()
    # the abandoned timeline, whole, laid out as a run folder
    assert sorted(p.name for p in aside.iterdir()) == [
        "README.md",
        "adapter_model.safetensors",
        "checkpoint-4",
        "checkpoint-5",
        "completions",
        "eval.json",
        "grpo_run.json",
        "metrics.jsonl",
    ]
    assert _steps(aside / "metrics.jsonl") == [3, 4, 5, 5]
    assert len(list((aside / "completions").iterdir())) == 3
    assert json.loads((aside / "eval.json").read_text())["after"] == {"accuracy": 0.5}
    assert "checkpoint-4, checkpoint-5" in caplog.text and str(aside) in caplog.text


def test_after_a_kill_only_the_records_after_the_checkpoint_move(tmp_path):
    out = tmp_path / "run"
    _finished_run(out, steps=3, saves=(2,))
    (out / "grpo_run.json").unlink()  # killed before the end: no final outputs were saved
    with (out / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 4, "lo')  # a line cut short by the kill
    aside = timeline.set_aside(out, 2)
    assert _steps(out / "metrics.jsonl") == [1, 2]
    assert (aside / "metrics.jsonl").read_text().splitlines()[-1] == '{"step": 4, "lo'
    assert (out / "adapter_model.safetensors").exists()  # not a later save's: left alone
    assert (out / "eval.json").exists()


def test_a_resume_from_the_newest_checkpoint_of_a_clean_stop_moves_nothing(tmp_path):
    out = tmp_path / "run"
    _finished_run(out, steps=4, saves=(2, 4))
    lines = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("\n".join(lines[:-1]) + "\n")  # no summary line
    (out / "completions" / "step_00004.parquet").unlink(missing_ok=True)
    assert not timeline.later(out, 4)
    assert timeline.set_aside(out, 4) is None
    assert not (out / rundir.ABANDONED_DIR).exists()
    assert _steps(out / "metrics.jsonl") == [1, 2, 3, 4]


def test_two_set_asides_in_the_same_second_get_two_folders(tmp_path):
    out = tmp_path / "run"
    _finished_run(out)
    first = timeline.set_aside(out, 4)
    (out / "checkpoint-5").mkdir()
    (out / "checkpoint-5" / "trainer_state.json").write_text("{}")
    second = timeline.set_aside(out, 4)
    assert first != second and first.exists() and second.exists()
    assert (first / "checkpoint-5").is_dir() and (second / "checkpoint-5").is_dir()


class Killed(BaseException):
    """A SIGKILL half way: nothing after it runs (no `except Exception` sees it)."""


def _killed_after(monkeypatch, moves: int) -> None:
    """os.replace as the set-aside uses it, the process killed once `moves` checkpoints moved."""
    real, moved = os.replace, []

    def replace(source, target):
        real(source, target)
        if checkpoints.checkpoint_step(source) is not None:
            moved.append(source)
            if len(moved) == moves:
                raise Killed

    monkeypatch.setattr(os, "replace", replace)


def _resumable(out, steps):
    for s in steps:  # complete, whole checkpoints: `true` may pick any of them
        save_file(
            {"w": torch.full((1,), float(s))}, out / f"checkpoint-{s}" / "adapter_model.safetensors"
        )


@pytest.mark.parametrize("moves", [1, 5])
def test_a_kill_during_the_move_is_finished_by_the_next_start(tmp_path, monkeypatch, moves):
    """Issue 56: resuming checkpoint-3 of a finished 12-step run, killed after 5 of the 9 later
    checkpoints had moved, left checkpoint-12 in place for `true` to pick."""
    out = tmp_path / "run"
    _finished_run(out, steps=12, saves=range(1, 13))
    _resumable(out, range(1, 13))
    _killed_after(monkeypatch, moves)
    with pytest.raises(Killed):
        timeline.set_aside(out, 3)
    monkeypatch.undo()
    left = sorted(p.name for p in out.iterdir() if checkpoints.checkpoint_step(p) is not None)
    assert len(left) == 12 - moves and "checkpoint-12" in left  # half moved, on disk
    # what the next start decides from: the decision recorded, not what is still on disk
    assert [p.name for p in checkpoints.checkpoints(out)] == ["checkpoint-1", "checkpoint-2",
                                                              "checkpoint-3"]  # fmt: skip
    assert checkpoints.latest_complete(out).name == "checkpoint-3"
    assert checkpoints.resolve_resume(out, True) == str(out / "checkpoint-3")
    assert lock.previous_run_files(out)[-1] == "checkpoint-3"
    with pytest.raises(ValueError, match="belongs to a timeline an earlier resume set aside"):
        checkpoints.resolve_resume(out, str(out / "checkpoint-12"))  # still there, on its way
    lock.claim(out, resume=True, overwrite=False)  # the next start: finishes the move
    lock.release(out)
    assert not (out / rundir.PENDING_FILE).exists()
    (aside,) = (out / rundir.ABANDONED_DIR).iterdir()
    assert sorted(p.name for p in aside.iterdir() if p.name.startswith("checkpoint-")) == [
        f"checkpoint-{s}" for s in sorted(range(4, 13), key=str)
    ]
    assert [p.name for p in checkpoints.checkpoints(out)] == ["checkpoint-1", "checkpoint-2",
                                                              "checkpoint-3"]  # fmt: skip
    assert _steps(out / "metrics.jsonl") == [1, 2, 3]
    assert _steps(aside / "metrics.jsonl") == [*range(4, 13), 12]
    assert len(list((aside / "completions").iterdir())) == 9  # tables of steps 3..11
    assert json.loads((aside / "eval.json").read_text())["after"] == {"accuracy": 0.5}
    assert set(json.loads((out / "eval.json").read_text())) == {"before", "dataset"}
    assert not (out / "adapter_model.safetensors").exists()  # the later save moved too
    assert (aside / "adapter_model.safetensors").read_bytes() == b"step-5 weights"


def test_a_kill_while_metrics_are_cut_is_finished_with_every_line_kept_once(tmp_path, monkeypatch):
    out = tmp_path / "run"
    _finished_run(out)
    real = rundir.write_text_atomic

    def cut_killed(path, text):  # the aside copy written, then killed before the run's own cut
        if path == out / "metrics.jsonl":
            raise Killed
        return real(path, text)

    monkeypatch.setattr(rundir, "write_text_atomic", cut_killed)
    with pytest.raises(Killed):
        timeline.set_aside(out, 2)
    monkeypatch.undo()
    assert timeline.set_aside(out, 2) is None  # the next resume from checkpoint-2: finished first
    (aside,) = (out / rundir.ABANDONED_DIR).iterdir()  # one folder, each line in it once
    assert _steps(out / "metrics.jsonl") == [1, 2]
    assert _steps(aside / "metrics.jsonl") == [3, 4, 5, 5]
