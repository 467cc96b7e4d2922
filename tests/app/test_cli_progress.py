"""`grpo-plugin train` as a person watches it: in a terminal (a pseudo-terminal, 160x40) the live
lines of every phase show while it works; piped, plain lines, one per phase and a periodic one
during training (the interval shortened, through the internal environment variable, to "every
update", so nothing here waits on a clock)."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from conftest import REPO_ROOT, TINY_CLI_RECIPE

from grpo_plugin.training.progress import INTERVAL_ENV

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture
def recipe(tmp_path, tiny_model_dir) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(TINY_CLI_RECIPE.format(model=tiny_model_dir, out=tmp_path / "out"))
    return path


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    env.update(HF_HUB_OFFLINE="1", TERM="xterm-256color", COLUMNS="160", LINES="40")
    env.pop(INTERVAL_ENV, None)
    return {**env, **extra}


def _command(recipe: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "grpo_plugin", "train", str(recipe), *flags]


def run_in_terminal(command: list[str], timeout_s: float = 300) -> tuple[int, str]:
    """Run `command` on a 160x40 pseudo-terminal; its exit code and everything it drew."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    proc = subprocess.Popen(
        command, stdin=follower, stdout=follower, stderr=follower, env=_env(), cwd=REPO_ROOT
    )
    os.close(follower)
    drawn, deadline = b"", time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                drawn += chunk
            elif proc.poll() is not None:
                break
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        os.close(leader)
    return proc.returncode, drawn.decode(errors="replace")


def test_in_a_terminal_the_live_lines_move_while_it_trains(recipe):
    code, drawn = run_in_terminal(_command(recipe))
    text = ANSI.sub("", drawn)
    assert code == 0, text[-2000:]
    frames = text.replace("\r\n", "\n").replace("\r", "\n").splitlines()
    bar = "━"  # rich's bar: only on a live line, never in a plain one
    training = [f for f in frames if "Training: step" in f and bar in f]
    assert training, text[-2000:]
    # a frame in the middle of training (not only the end): step 1 or 2 of 3, with its fields
    middle = [f for f in training if re.search(r" [12]/3 ", f)]
    assert middle and "reward " in middle[-1] and "s/step" in middle[-1], training
    assert "left" in " ".join(middle)
    assert any("eval before training" in f and bar in f for f in frames)  # before training too
    assert any(f.startswith("Training: step 3/3 (3 steps in ") for f in frames)  # left behind
    assert "Talk to the model: grpo-plugin chat" in text


def test_piped_the_log_gets_plain_lines_during_training(recipe):
    env = _env(**{INTERVAL_ENV: "0"})  # a line at every update instead of every 30 s
    proc = subprocess.run(_command(recipe), capture_output=True, text=True, env=env,
                          cwd=REPO_ROOT, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert "\x1b[" not in proc.stderr  # no terminal codes in a log
    for step in (1, 2, 3):
        found = [line for line in lines if line.startswith(f"Training: step {step}/3, ")]
        assert found and "reward " in found[-1] and "s/step" in found[-1], proc.stderr
    assert any(line.startswith("eval before training 0/4 prompts") for line in lines)
    assert any(line.startswith("eval after training: 4 prompts in ") for line in lines)
    assert any(line.startswith("Saving the model to ") for line in lines)
    assert (recipe.parent / "out" / "report.html").is_file()  # written at the end by default


def test_disable_tqdm_turns_the_progress_lines_off(recipe):
    env = _env(**{INTERVAL_ENV: "0"})
    flags = ("--disable_tqdm", "true", "--report", "false")
    proc = subprocess.run(_command(recipe, *flags), capture_output=True, text=True, env=env,
                          cwd=REPO_ROOT, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Training: step" not in proc.stderr and "eval before training" not in proc.stderr
    assert "Loaded " in proc.stderr  # the log lines stay
    assert not (recipe.parent / "out" / "report.html").exists()  # report: false
    assert "Report (open it" not in proc.stdout and "grpo-plugin chat" in proc.stdout
