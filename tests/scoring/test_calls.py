"""Where reward functions run (`calls.py`, `user_code/worker.py`): the user's in a worker process
that a time limit can kill, stuck in C code too; the same answers, errors and logging as in the
trainer's process; built-ins and marked functions in the trainer's process."""

from __future__ import annotations

import contextlib
import os
import random
import re
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import reward_fns
from grpo_plugin.scoring.calls import in_worker
from grpo_plugin.scoring.context import RewardContext
from grpo_plugin.scoring.scorer import RewardChecks, RewardFunctionError, RewardScorer
from grpo_plugin.user_code import worker as isolation

CATASTROPHIC = r"(a+)+$"  # backtracks 2^n steps on "a" * n + "b", in C, holding the lock


def score(funcs, completions, checks=None, context=None, **columns):
    checks = checks or RewardChecks()
    scorer = RewardScorer(tuple(funcs), torch.ones(len(funcs)), checks, context)
    return scorer.score_columns(["p"] * len(completions), completions, [[1]] * len(completions), columns)  # fmt: skip


def backtracks(prompts, completions, **kw):
    return [float(re.match(CATASTROPHIC, "a" * 60 + "b") is not None) for _ in completions]


def exits(prompts, completions, **kw):
    raise SystemExit(0)


def hard_exits(prompts, completions, **kw):
    os._exit(3)


def length(prompts, completions, **kw):
    return [float(len(c)) for c in completions]


def test_a_reward_stuck_in_c_code_is_stopped_at_its_timeout_and_the_worker_replaced():
    with pytest.raises(RewardFunctionError) as err:
        score([backtracks], ["a"], RewardChecks(timeout=1.0))
    assert str(err.value) == (
        "reward function 'backtracks' timed out: it did not return within 1 s; make it faster or "
        "raise reward_timeout (None: no limit)."
    )
    assert score([length], ["abc"]).tolist() == [[3.0]]  # a new worker serves the next call


def test_a_reward_that_exits_is_an_error_naming_it_never_a_clean_exit():
    with pytest.raises(RewardFunctionError, match=r"'exits' raised SystemExit on sample 0: 0; a"):
        score([exits], ["a"])
    with pytest.raises(RewardFunctionError, match=r"'hard_exits' ended its worker process \(exit code 3\)"):  # fmt: skip
        score([hard_exits], ["a"])
    assert score([length], ["ab"]).tolist() == [[2.0]]


def test_an_exception_names_the_function_and_sample_with_the_workers_traceback_as_cause():
    def picky(prompts, completions, **kw):
        return [1.0 / (c != "b") for c in completions]

    with pytest.raises(RewardFunctionError) as err:
        score([picky], ["a", "b"])
    assert str(err.value) == "reward function 'picky' raised ZeroDivisionError on sample 1: float division by zero"  # fmt: skip
    assert isinstance(err.value.__cause__, isolation.WorkerTraceback)
    assert 'return [1.0 / (c != "b")' in str(err.value.__cause__)  # the user's line


def test_random_draws_are_those_of_the_trainers_process():
    """A reward drawing from `random`, numpy and torch gets the same numbers in the worker as in
    this process, and this process's generators advance as if it had drawn them."""
    import numpy as np

    def noisy(prompts, completions, **kw):
        return [random.random() + np.random.rand() + torch.rand(()).item() for _ in completions]

    outs, after = [], []
    for isolate in (True, False):
        random.seed(7), np.random.seed(7), torch.manual_seed(7)
        outs.append(score([noisy], ["a", "b"], RewardChecks(isolate=isolate)).tolist())
        after.append((random.random(), np.random.rand(), torch.rand(()).item()))
    assert outs[0] == outs[1] and after[0] == after[1]


def test_trainer_state_is_the_live_one_and_what_the_worker_logs_comes_back():
    state = {"step": 0}
    context = RewardContext(lambda: dict(state))

    def shaped(prompts, completions, trainer_state, log_extra, log_metric, **kw):
        log_extra("len", [len(c) for c in completions])
        log_metric("step_seen", trainer_state["step"])
        return [0.0] * len(completions)

    for step in (3, 4):
        state["step"] = step
        score([shaped], ["ab", "c"], context=context)
    assert context.pop_logged() == ({"len": [2, 1, 2, 1]}, {"step_seen": 3.5})


def test_the_worker_keeps_its_own_state_and_this_process_keeps_its_own():
    """The documented difference: what a function changes in the worker is not seen here."""
    calls = []

    def counting(prompts, completions, **kw):
        calls.append(1)
        return [float(len(calls))] * len(completions)

    assert [score([counting], ["a"]).item() for _ in range(3)] == [1.0, 2.0, 3.0]  # kept there
    assert calls == []  # not here
    assert score([reward_fns.in_process(counting)], ["a"]).item() == 1.0  # marked: runs here
    assert calls == [1]


def test_which_functions_run_where():
    checks = RewardChecks()
    assert in_worker(length, checks)
    assert not in_worker(length, RewardChecks(isolate=False))
    for name in ("exact_integer", "gsm8k", "math", "think_format", "soft_overlong", "code_tests"):
        assert not in_worker(reward_fns.get(name), checks), name  # bounded built-ins
    assert not in_worker(reward_fns.get("think_format", think_tag="reason"), checks)  # partial


def test_in_the_trainers_process_a_call_stuck_in_c_code_ends_the_process_with_its_stack():
    """isolate_user_code=False: the signal cannot interrupt C code; the C timer of
    `in_process_limit` ends the process HARD_STOP_GRACE_S past the limit, printing the stack."""
    script = textwrap.dedent(
        f"""
        import re, torch
        from grpo_plugin.user_code import worker as isolation
        from grpo_plugin.scoring.scorer import RewardChecks, RewardScorer
        isolation.HARD_STOP_GRACE_S = 0.5
        def backtracks(prompts, completions, **kw):
            return [float(re.match({CATASTROPHIC!r}, "a" * 60 + "b") is not None)]
        RewardScorer((backtracks,), torch.ones(1), RewardChecks(timeout=0.5, isolate=False)
                     ).score_columns(["p"], ["a"], [[1]], {{}})
        print("returned")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1 and "returned" not in done.stdout
    assert "Timeout" in done.stderr and "backtracks" in done.stderr  # where it was stuck


def test_arguments_that_cannot_travel_are_an_error_naming_the_function_and_the_way_out():
    import threading

    def reads_a_column(prompts, completions, handle, **kw):
        return [1.0] * len(completions)

    with pytest.raises(RewardFunctionError) as err:
        score([reads_a_column], ["a"], handle=[threading.Lock()])  # a lock does not pickle
    assert str(err.value).startswith(
        "reward function 'reads_a_column' could not run in the worker process: its arguments "
        "cannot be sent to the worker process ("
    )
    assert "reward_fns.in_process, or set isolate_user_code=False" in str(err.value)
    assert score([length], ["abc"]).tolist() == [[3.0]]  # the worker is still there


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended


def _ignored_signals(pid: int) -> int:
    line = next(x for x in open(f"/proc/{pid}/status") if x.startswith("SigIgn:"))
    return int(line.split()[1], 16)


def starts_a_sleeper(prompts, completions, **kw):
    child = subprocess.Popen(["sleep", "600"])
    return [float(child.pid) for _ in completions]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
@pytest.mark.parametrize("how", ["replaced", "stopped"])
def test_a_program_a_reward_starts_ends_with_its_worker_and_takes_default_signals(how):
    pid = int(score([starts_a_sleeper], ["a"]).item())
    assert _alive(pid)
    ignored = _ignored_signals(pid)
    assert not ignored & (1 << (2 - 1)) and not ignored & (1 << (15 - 1))  # SIGINT, SIGTERM
    if how == "replaced":
        with pytest.raises(RewardFunctionError, match="timed out"):
            score([backtracks], ["a"], RewardChecks(timeout=1.0))
    else:
        isolation.shared_worker().stop()  # what the trainer's exit runs (atexit)
    for _ in range(100):  # the kill is sent at once; the kernel ends the process soon after
        if not _alive(pid):
            break
        time.sleep(0.05)
    assert not _alive(pid)


def reads_stdin(prompts, completions, **kw):
    return [float(len(sys.stdin.read())) for _ in completions]


def test_a_reward_that_reads_stdin_reads_nothing_not_the_trainers_input():
    read, write = os.pipe()  # a stdin nobody writes to: a read there would block forever
    saved = os.dup(0)
    try:
        os.dup2(read, 0)
        isolation.shared_worker().stop()  # the next call forks a worker with this stdin
        assert score([reads_stdin], ["a"], RewardChecks(timeout=60.0)).tolist() == [[0.0]]
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read, write):
            os.close(fd)


def killed(prompts, completions, **kw):
    os.kill(os.getpid(), 9)


def test_a_worker_the_kernel_killed_for_memory_says_out_of_memory(monkeypatch):
    counts = iter([5, 6])  # when the call began, then when it ended: one OOM kill counted
    monkeypatch.setattr(isolation, "oom_kills", lambda: next(counts))
    isolation.shared_worker().stop()
    with pytest.raises(RewardFunctionError) as err:
        score([killed], ["a"])
    assert str(err.value) == (
        "reward function 'killed' ended its worker process (killed by SIGKILL: out of memory (the "
        "kernel's OOM killer ended it)); make it use less memory (it scores a step's completions "
        "in one call), or give the run more."
    )
    monkeypatch.setattr(isolation, "oom_kills", lambda: 5)  # no OOM kill meanwhile
    isolation.shared_worker().stop()
    with pytest.raises(
        RewardFunctionError, match=r"ended its worker process \(killed by SIGKILL\)"
    ):
        score([killed], ["a"])


def test_an_oom_kill_before_the_call_is_not_this_workers(monkeypatch):
    """The kernel counts every OOM kill of the machine: one between the fork and the call (a
    `code_tests` program over its cap, another job) says nothing of a later `kill -9`."""
    count = [5]
    monkeypatch.setattr(isolation, "oom_kills", lambda: count[0])
    isolation.shared_worker().stop()
    assert score([length], ["abc"]).tolist() == [[3.0]]  # the worker, forked at 5
    count[0] = 6  # an OOM kill elsewhere
    with pytest.raises(RewardFunctionError, match=r"worker process \(killed by SIGKILL\) instead"):
        score([killed], ["a"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a pty of Linux")
def test_a_reward_that_prints_to_a_terminal_with_tostop_is_not_stopped():
    """`stty tostop`: a background process group that writes to its terminal gets SIGTTOU and
    stops. The worker has no terminal (a session of its own), so a reward that prints returns."""
    import fcntl
    import termios

    script = textwrap.dedent(
        """
        import fcntl, sys, termios, torch
        from grpo_plugin.scoring.scorer import RewardChecks, RewardScorer

        def prints(prompts, completions, **kw):
            print("scoring", len(completions), flush=True)
            return [1.0 for _ in completions]

        fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # the pty is this session's terminal
        scorer = RewardScorer((prints,), torch.ones(1), RewardChecks(timeout=60.0))
        try:
            print("answer", scorer.score_columns(["p"], ["a"], [[1]], {}).tolist(), flush=True)
        except Exception as err:
            print("answer", err, flush=True)
        """
    )
    leader, follower = os.openpty()
    attrs = termios.tcgetattr(follower)
    attrs[3] |= termios.TOSTOP
    termios.tcsetattr(follower, termios.TCSANOW, attrs)
    fcntl.fcntl(leader, fcntl.F_SETFL, os.O_NONBLOCK)
    trainer = subprocess.Popen(
        [sys.executable, "-c", script], stdin=follower, stdout=follower, stderr=follower,
        start_new_session=True,
    )  # fmt: skip
    os.close(follower)
    assert trainer.wait(timeout=180) == 0
    output = b""
    with contextlib.suppress(OSError):  # EIO: the terminal's last writer has ended
        while chunk := os.read(leader, 1 << 16):
            output += chunk
    os.close(leader)
    lines = output.decode().splitlines()
    assert [line for line in lines if line.startswith("answer")] == ["answer [[1.0]]"], lines


@pytest.fixture
def memory_cgroup():
    """A cgroup of 400 MiB to run a trainer in, as the `code_tests` sandbox makes its own."""
    from reward_fns import sandbox_cgroup

    found = sandbox_cgroup.hierarchy()
    if found is None:
        pytest.skip("no cgroup can be made here")
    cgroup = sandbox_cgroup.RunCgroup(found, 400 << 20, 64)
    yield cgroup
    cgroup.kill_all()
    cgroup.remove()


def test_a_reward_over_its_cgroups_memory_limit_ran_out_of_memory(memory_cgroup):
    """The kernel's OOM killer itself (no faked count), under a cgroup's memory limit."""
    script = textwrap.dedent(
        """
        import torch
        from grpo_plugin.scoring.scorer import RewardChecks, RewardScorer

        def eats_memory(prompts, completions, **kw):
            chunks = []
            while True:
                chunks.append(bytearray(16 << 20))

        scorer = RewardScorer((eats_memory,), torch.ones(1), RewardChecks(timeout=120.0))
        try:
            scorer.score_columns(["p"], ["a"], [[1]], {})
        except Exception as err:
            print(err)
        """
    )
    argv = memory_cgroup.wrap([sys.executable, "-c", script])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "reward function 'eats_memory' ended its worker process (killed by SIGKILL: out of "
        "memory (the kernel's OOM killer ended it)); make it use less memory (it scores a step's "
        "completions in one call), or give the run more."
    )
