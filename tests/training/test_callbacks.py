"""The trainer's progress callback: step, reward, s/step and time left on the board; there unless
`disable_tqdm=True`, and with it the trainer's other phases (saving, the report)."""

from __future__ import annotations

import io
from types import SimpleNamespace

from conftest import make_trainer
from rich.console import Console

from grpo_plugin.training.callbacks import (
    RunProgressCallback,
    evaluation_progress,
    outcome_summary,
    trainer_phase,
)
from grpo_plugin.training.progress import ProgressBoard


def test_training_lines_carry_step_reward_pace_and_time_left():
    out = io.StringIO()
    board = ProgressBoard(Console(file=out, force_terminal=False, width=60), live=False, interval=0)
    callback = RunProgressCallback(board)
    state = SimpleNamespace(is_world_process_zero=True, global_step=0, max_steps=4)
    callback.on_train_begin(None, state, None)
    for step in (1, 2):
        state.global_step = step
        callback.on_step_end(None, state, None)
        callback.on_log(None, state, None, logs={"reward": 0.25 * step, "loss": 0.0})
    with callback.evaluation("eval at step 2", 8) as advance:
        advance(8)
    state.global_step = 4
    callback.on_train_end(None, state, None)
    lines = out.getvalue().splitlines()
    step2 = [line for line in lines if line.startswith("Training: step 2/4, reward 0.500")]
    assert step2 and "s/step" in step2[-1] and " left (" in step2[-1]
    assert any(line.startswith("eval at step 2 8/8 prompts") for line in lines)
    assert any(line.startswith("eval at step 2: 8 prompts in ") for line in lines)
    assert lines[-1].startswith("Training: step 4/4 (4 steps in ")
    assert "kl" not in out.getvalue()  # not logged (beta = 0): not shown
    assert board.tasks == []


def test_the_line_says_why_programs_failed():
    out = io.StringIO()
    board = ProgressBoard(
        Console(file=out, force_terminal=False, width=200), live=False, interval=0
    )
    callback = RunProgressCallback(board)
    state = SimpleNamespace(is_world_process_zero=True, global_step=1, max_steps=4)
    callback.on_train_begin(None, state, None)
    prefix = "outcome/code_tests/"
    shares = {"passed": 0.0, "syntax_error": 0.5, "timeout": 0.125, "no_function": 0.375}
    logs = {"reward": 0.0, **{prefix + k: v for k, v in shares.items()}}
    callback.on_log(None, state, None, logs={**logs, "eval_" + prefix + "passed": 1.0})
    line = out.getvalue().splitlines()[-1]
    assert "code_tests: 50% syntax_error, 38% no_function, 12% timeout" in line
    assert "passed" not in line  # a share of 0 is not shown, nor the evaluation's
    assert outcome_summary({"reward": 1.0}) == ""


def test_other_processes_show_nothing():
    out = io.StringIO()
    board = ProgressBoard(Console(file=out, force_terminal=False), live=False, interval=0)
    callback = RunProgressCallback(board)
    state = SimpleNamespace(is_world_process_zero=False, global_step=0, max_steps=4)
    callback.on_train_begin(None, state, None)
    callback.on_step_end(None, state, None)
    callback.on_train_end(None, state, None)
    assert out.getvalue() == ""


def test_the_callback_is_there_unless_disable_tqdm(tiny_tokenizer, tmp_path, capsys):
    def progress_callbacks(trainer):
        return [c for c in trainer.callback_handler.callbacks if isinstance(c, RunProgressCallback)]

    shown = make_trainer(tiny_tokenizer, tmp_path / "a", disable_tqdm=False)
    assert len(progress_callbacks(shown)) == 1
    off = make_trainer(tiny_tokenizer, tmp_path / "b", disable_tqdm=True)
    assert progress_callbacks(off) == []
    with evaluation_progress(off, "eval", 4) as advance:  # a no-op, not an error
        advance(4)
    with trainer_phase(off, "Saving the model"):
        pass
    assert "Saving the model" not in capsys.readouterr().err
    with trainer_phase(shown, "Saving the model"):
        pass
    assert "Saving the model: done in " in capsys.readouterr().err  # stderr is not a terminal
