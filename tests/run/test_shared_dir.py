"""The shared-output_dir check's pieces on one process: the files, the answers, the messages. The
check itself across two machines (one launch each, on loopback) is in
tests/training/test_multi_machine_launch.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from grpo_plugin.run import rundir, shared_dir
from grpo_plugin.run.shared_dir import Answer, describe_problem


def test_one_process_has_nothing_to_check(tmp_path):
    out = tmp_path / "out"
    shared_dir.check_shared(out, SimpleNamespace(num_processes=1, process_index=0))
    shared_dir.check_shared(out, None)
    assert not out.exists()  # nothing written, no folder made


def test_a_process_that_shares_the_folder_reads_the_token_and_answers(tmp_path, monkeypatch):
    monkeypatch.setattr(shared_dir, "GRACE_S", 0.2)
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    nonce = shared_dir._write_token(out)  # process 0
    assert shared_dir.token_path(out, nonce).name == rundir.SHARED_CHECK_PREFIX + nonce
    assert shared_dir._answer(out, nonce, 1) == Answer(shared_dir.socket.gethostname(), True)
    assert shared_dir.token_path(out, nonce, 1).read_text() == nonce  # its answer, written
    assert not shared_dir._answer(elsewhere, nonce, 1).sees  # a folder of its own
    shared_dir._clean_up(out, nonce, world=2, created=True)
    assert not out.exists()  # made for the check, empty again: removed


def test_the_clean_up_keeps_a_folder_that_was_there_or_holds_files(tmp_path):
    (tmp_path / "user-notes.txt").write_text("mine")
    nonce = shared_dir._write_token(tmp_path)
    shared_dir._clean_up(tmp_path, nonce, world=3, created=True)  # answers 1, 2 never written
    assert [p.name for p in tmp_path.iterdir()] == ["user-notes.txt"]


def test_every_process_seeing_the_folder_is_no_problem():
    assert describe_problem("/shared/run", [Answer("a", True), Answer("b", True)]) is None


def test_processes_that_do_not_see_the_folder_are_named_with_their_hosts():
    answers = [Answer("node0", True)] + [Answer(f"node{k}", k % 2 == 0) for k in range(1, 12)]
    message = describe_problem("runs/x", answers)
    assert message.startswith("output_dir runs/x is not one folder shared by every machine: ")
    assert "processes 1 (node1), 3 (node3), 5 (node5), 7 (node7) and 2 more cannot see" in message
    assert "process 0 (node0) wrote" in message
    assert "mounts at the same path" in message and "\n" not in message


def test_a_process_that_cannot_write_there_is_named():
    answers = [Answer("a", True), Answer("b", True, "Read-only file system")]
    message = describe_problem("/shared/run", answers)
    assert "process 1 (b) cannot write there (Read-only file system)" in message


def test_process_0_that_cannot_write_says_so_in_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match=r"cannot be written by process 0 \(Not a directory\)"):
        shared_dir._write_token(blocker / "run")
