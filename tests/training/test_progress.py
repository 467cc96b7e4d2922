"""The progress board: plain lines (a pipe, a log) and live lines (a terminal), the timer that
keeps a log alive during a long step, and the formats."""

from __future__ import annotations

import io
import threading
import time

import pytest
from rich.console import Console

from grpo_plugin.training import progress
from grpo_plugin.training.progress import ProgressBoard, format_duration


def plain(interval: float = 0.0) -> tuple[ProgressBoard, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=60)
    return ProgressBoard(console, live=False, interval=interval), out


def wait_for(predicate, deadline_s: float = 30.0) -> bool:
    """Poll (a liveness wait, not a timing assertion)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0s"), (42.4, "42s"), (425, "7m 05s"), (7380, "2h 03m")]
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_plain_lines_one_per_update_at_interval_0_and_a_summary():
    board, out = plain(interval=0.0)
    task = board.task("Training: step", 3, "reward 0.100")
    for step in (1, 2, 3):
        task.update(completed=step, status=f"reward 0.{step}00, 1.5 s/step")
    task.finish("Training: done")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("Training: step 0/3, reward 0.100 (")
    assert [line.split(",")[0] for line in lines[1:4]] == [
        "Training: step 1/3",
        "Training: step 2/3",
        "Training: step 3/3",
    ]
    assert "reward 0.300, 1.5 s/step" in lines[3]
    assert lines[-1] == "Training: done" and board.tasks == []


def test_plain_lines_wait_for_the_interval():
    board, out = plain(interval=3600.0)
    with board.phase("Saving the model") as task:
        for _ in range(5):
            task.update(status="still saving")
    lines = out.getvalue().splitlines()
    assert lines[0] == "Saving the model ..."  # announced; no line per update within the hour
    assert len(lines) == 2 and lines[1].startswith("Saving the model: done in ")


def test_a_quiet_task_gets_a_line_from_the_timer_and_the_timer_stops():
    board, out = plain(interval=0.05)
    task = board.task("Loading model m", announce=False)  # a step that never ends, until...
    assert wait_for(lambda: out.getvalue().count("Loading model m (") >= 2)
    task.finish("")
    assert wait_for(lambda: not any(t.name == "grpo-progress" for t in threading.enumerate()))
    written = out.getvalue()
    time.sleep(0.2)
    assert out.getvalue() == written  # nothing after the last task went


def test_a_phase_that_raises_leaves_no_summary():
    board, out = plain()
    with pytest.raises(RuntimeError), board.phase("Loading"):
        raise RuntimeError("boom")
    assert out.getvalue().splitlines() == ["Loading ..."] and board.tasks == []


def test_live_lines_in_a_terminal_show_each_update_and_leave_the_summaries():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120, color_system=None)
    board = ProgressBoard(console)
    assert board.live
    train = board.task("Training: step", 4)
    train.update(completed=1, status="reward 0.250, 2.0 s/step, 6s left")
    evaluation = board.task("eval at step 1", 8, unit=" prompts")  # both on one display
    evaluation.advance(4)
    shown = out.getvalue()
    assert "1/4" in shown and "reward 0.250, 2.0 s/step, 6s left" in shown
    assert "4/8 prompts" in shown
    evaluation.finish("eval at step 1: 8 prompts in 0.1 s")
    train.finish("Training: step 4/4")
    shown = out.getvalue()
    assert "eval at step 1: 8 prompts in 0.1 s" in shown and "Training: step 4/4" in shown
    assert board.tasks == [] and not console.is_alt_screen


def test_dumb_terminal_and_files_get_plain_lines():
    file_console = Console(file=io.StringIO(), force_terminal=False)
    assert not ProgressBoard(file_console).live
    dumb = Console(file=io.StringIO(), force_terminal=True, _environ={"TERM": "dumb"})
    assert not ProgressBoard(dumb).live  # TERM=dumb (an editor's shell): no cursor movement


def test_disabled_phase_shows_nothing(capsys):
    with progress.phase("Loading", enabled=False) as task:
        task.advance(3)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("value", "expected"), [("", 30.0), ("0", 0.0), ("2.5", 2.5), ("x", 30.0)])
def test_the_interval_can_be_shortened_for_tests(monkeypatch, value, expected):
    monkeypatch.setenv(progress.INTERVAL_ENV, value)
    assert progress.plain_interval() == expected
