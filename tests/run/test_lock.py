"""One run per output directory: a held lock refuses a second run, a killed holder frees it, a
rerun must resume or overwrite, and overwriting deletes only what a run wrote."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
from conftest import held_lock

from grpo_plugin.run import checkpoints, ownership, rundir
from grpo_plugin.run import lock as run_lock

# Another run's main process, as the lock file shows it (plain fcntl: no torch import, fast).
HOLD = """
import fcntl, json, os, socket, time
os.makedirs({out!r}, exist_ok=True)
fd = os.open(os.path.join({out!r}, {name!r}), os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
os.write(fd, json.dumps({{"pid": os.getpid(), "host": socket.gethostname(), "started": "now"}}).encode())
print("held", flush=True)
time.sleep(60)
"""


def _holder(out):
    script = HOLD.format(out=str(out), name=run_lock.LOCK_FILE)
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_held_directory_is_refused_and_a_killed_holder_frees_it(tmp_path):
    out = tmp_path / "run"
    proc = _holder(out)
    try:
        with pytest.raises(
            run_lock.OutputDirInUse, match=rf"in use by another run \(pid {proc.pid} on"
        ):
            run_lock.claim(out, resume=False, overwrite=False)
        with pytest.raises(run_lock.OutputDirInUse):
            run_lock.check_not_in_use(out)
    finally:
        proc.send_signal(signal.SIGKILL)  # kill -9: flock is released by the kernel
        proc.wait()
    lock = run_lock.claim(out, resume=False, overwrite=False)
    assert lock.fd is not None
    run_lock.release(out)
    assert not (out / run_lock.LOCK_FILE).exists()  # removed once released


def test_the_lock_is_reentrant_within_a_process(tmp_path):
    first = run_lock.claim(tmp_path, resume=False, overwrite=False)
    assert run_lock.claim(tmp_path, resume=False, overwrite=False) is first
    run_lock.release(tmp_path)
    assert run_lock.is_claimed(tmp_path)  # one claim is still open
    with pytest.raises(run_lock.OutputDirInUse):  # another descriptor: another "run"
        run_lock.RunLock(tmp_path).acquire()
    run_lock.release(tmp_path)
    assert not run_lock.is_claimed(tmp_path)


CARD = "---\nlibrary_name: peft\ntags:\n- grpo\n- grpo-plugin\n---\n\n# run\n"


def _old_run(out, notes=False):
    (out / "completions").mkdir(parents=True)
    (out / "completions" / "step_00000.parquet").write_bytes(b"x")
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / "checkpoint-2").mkdir()
    (out / "README.md").write_text(CARD)  # the model card a run writes
    (out / "adapter_model.safetensors").write_bytes(b"w")
    (out / "tokenizer.json").write_text("{}")
    if notes:
        (out / "my_notes.txt").write_text("not the run's")


def test_a_rerun_is_refused_unless_it_resumes_or_overwrites(tmp_path):
    _old_run(tmp_path)
    with pytest.raises(ValueError, match="holds a run with no complete checkpoint to resume from"):
        run_lock.claim(tmp_path, resume=False, overwrite=False)
    assert not run_lock.is_claimed(tmp_path)  # a refused claim keeps no lock
    run_lock.claim(tmp_path, resume=True, overwrite=False)
    run_lock.release(tmp_path)
    assert (tmp_path / "metrics.jsonl").exists()  # resuming deletes nothing


def test_overwrite_deletes_only_what_a_run_writes(tmp_path):
    _old_run(tmp_path, notes=True)
    with pytest.raises(ValueError, match=r"holds files no run of grpo-plugin wrote \(my_notes"):
        run_lock.claim(tmp_path, resume=False, overwrite=True)  # a user's file: asked first
    assert (tmp_path / "metrics.jsonl").exists()
    run_lock.claim(tmp_path, resume=False, overwrite=True, others_ok=True)
    run_lock.release(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["my_notes.txt"]


def test_a_users_readme_is_never_written_over_nor_deleted(tmp_path):
    (tmp_path / "README.md").write_text("a user's own readme")  # no run markers beside it
    for others_ok in (False, True):
        with pytest.raises(ValueError, match="holds README.md, which no run of grpo-plugin wrote"):
            run_lock.claim(tmp_path, resume=False, overwrite=True, others_ok=others_ok)
    _old_run(tmp_path / "run")
    (tmp_path / "run" / "README.md").write_text("# My notes on this run\n")  # not our card
    with pytest.raises(ValueError, match="holds README.md, which no run"):
        run_lock.claim(tmp_path / "run", resume=True, overwrite=False, others_ok=True)
    assert (tmp_path / "README.md").read_text() == "a user's own readme"
    assert (tmp_path / "run" / "README.md").read_text() == "# My notes on this run\n"


def test_lock_holder_names_another_process_and_only_while_it_holds(tmp_path):
    out = tmp_path / "run"
    assert run_lock.lock_holder(tmp_path / "nothing-here") is None
    proc = _holder(out)
    try:
        holder = run_lock.lock_holder(out)
        assert holder is not None and holder.startswith(f"pid {proc.pid} on ")
    finally:
        proc.kill()
        proc.wait()
    assert run_lock.lock_holder(out) is None  # a killed holder frees it (the file stays)
    run_lock.claim(out, resume=False, overwrite=False)
    try:
        assert run_lock.lock_holder(out) is None  # this process's own run is no other's
    finally:
        run_lock.release(out)


def _dead_pid() -> int:
    """The pid of a process that has ended (a run killed while it wrote a file)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_kill_while_a_record_is_rewritten_leaves_nothing_that_bricks_the_folder(tmp_path):
    """Issue 56: SIGKILL while metrics.jsonl (or eval.json) was rewritten left
    `.metrics.jsonl-<pid>-<hex>`, and every later run was refused as holding files no run wrote."""
    _old_run(tmp_path)
    (tmp_path / "checkpoint-2" / "trainer_state.json").write_text("{}")
    dead = _dead_pid()
    stale = [f".metrics.jsonl-{dead}-0123abcd", f".eval.json-{dead}-89abcdef"]
    for name in stale:
        (tmp_path / name).write_text('{"step": 1')
    (tmp_path / "completions" / f".step_00001.parquet-{dead}-00ff00ff").write_bytes(b"half")
    live = f".report.html-{os.getppid()}-fedcba98"  # being written now by a live process
    (tmp_path / live).write_text("<!--")
    assert ownership.others(tmp_path) == ([], [])  # a run's own, not a user's
    run_lock.check_rerun(tmp_path, resume=True, overwrite=False)  # what --dry-run checks
    run_lock.claim(tmp_path, resume=True, overwrite=False)
    run_lock.release(tmp_path)
    assert not any((tmp_path / name).exists() for name in stale)  # a dead writer's: removed
    assert not list((tmp_path / "completions").glob(".step_*"))
    assert (tmp_path / live).exists()  # a live writer's: left to it
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_a_temporary_name_is_one_pattern_for_every_writer(tmp_path):
    path = rundir.temporary_path(tmp_path / "eval.json")
    assert rundir.temporary_of(path.name) == ("eval.json", os.getpid())
    assert rundir.temporary_of("eval.json") is None
    assert rundir.temporary_of(".eval.json-12-nothex!") is None


def _linked_run(tmp_path):
    out, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    _old_run(out)
    elsewhere.mkdir()
    (elsewhere / "trainer_state.json").write_text("{}")
    (out / "checkpoint-12").symlink_to(elsewhere, target_is_directory=True)
    return out, elsewhere


def test_a_symlinked_checkpoint_is_refused_before_anything_is_deleted(tmp_path):
    """Issue 56: with checkpoint-12 a symlink, --overwrite_output_dir deleted the README, the
    adapter and checkpoints, then died in a traceback (`Cannot call rmtree on a symbolic link`)."""
    out, elsewhere = _linked_run(tmp_path)
    before = sorted(os.listdir(out))
    for resume, overwrite in ((False, True), (True, False), (False, False)):
        with pytest.raises(ValueError, match=r"holds checkpoint-12, a symbolic link \(to ") as err:
            run_lock.check_rerun(out, resume=resume, overwrite=overwrite)  # --dry-run too
        assert "Remove the link" in str(err.value) and "\n" not in str(err.value)
        with pytest.raises(ValueError, match="a symbolic link"):
            run_lock.claim(out, resume=resume, overwrite=overwrite)
    with pytest.raises(ValueError, match="a symbolic link"):
        run_lock.clear_previous_run(out)  # called directly: checked before deleting too
    assert sorted(os.listdir(out)) == before  # nothing deleted
    assert os.listdir(elsewhere) == ["trainer_state.json"]  # nor through the link
    (out / "checkpoint-12").unlink()  # the fix the line names
    run_lock.claim(out, resume=False, overwrite=True)
    run_lock.release(out)
    assert os.listdir(out) == [] and os.listdir(elsewhere) == ["trainer_state.json"]


def test_a_kill_while_a_run_is_cleared_is_finished_by_the_next_start(tmp_path, monkeypatch):
    _old_run(tmp_path)
    real, calls = shutil.rmtree, []

    def killed_after_one(path, *args, **kwargs):
        if calls:
            raise KeyboardInterrupt  # stands for the kill: nothing after it runs
        calls.append(path)
        real(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", killed_after_one)
    with pytest.raises(KeyboardInterrupt):
        run_lock.claim(tmp_path, resume=False, overwrite=True)
    monkeypatch.undo()
    assert (tmp_path / "completions").is_dir() or (tmp_path / "checkpoint-2").is_dir()
    assert checkpoints.checkpoints(tmp_path) == []  # on its way out: no longer the run's
    assert run_lock.previous_run_files(tmp_path) == []
    run_lock.claim(tmp_path, resume=False, overwrite=False)  # the plain command goes on
    run_lock.release(tmp_path)
    assert os.listdir(tmp_path) == []


def test_a_start_that_never_trained_leaves_no_run(tmp_path):
    """What a start stopped before its first step leaves (the evaluation before training)
    holds nothing to lose: the plain command starts again there, over it."""
    (tmp_path / "eval.json").write_text('{"dataset": "arithmetic", "before": {"accuracy": 0.1}}')
    (tmp_path / "completions").mkdir()
    (tmp_path / "metrics.jsonl").write_text("")
    assert run_lock.nothing_to_lose(tmp_path) and run_lock.previous_run_files(tmp_path) == []
    run_lock.check_rerun(tmp_path, resume=False, overwrite=False)
    run_lock.claim(tmp_path, resume=False, overwrite=False)
    run_lock.release(tmp_path)
    assert os.listdir(tmp_path) == []  # cleared: the new run starts clean
    for records in ('{"step": 1, "loss": 0.5}\n', ""):  # a trained step; an evaluation after
        (tmp_path / "metrics.jsonl").write_text(records)
        after = {"before": {"accuracy": 0.1}} | ({} if records else {"after": {"accuracy": 1}})
        (tmp_path / "eval.json").write_text(json.dumps(after))
        assert not run_lock.nothing_to_lose(tmp_path)
        with pytest.raises(ValueError, match="no complete checkpoint"):
            run_lock.check_rerun(tmp_path, resume=False, overwrite=False)


def test_a_finished_run_without_checkpoints_is_called_finished(tmp_path):
    """`save_strategy: no` (the demo): trained to the end, its model saved, no checkpoint."""
    _old_run(tmp_path)
    shutil.rmtree(tmp_path / "checkpoint-2")
    info = {"global_step": 12, "grpo_plugin_version": "0"}
    (tmp_path / "grpo_run.json").write_text(json.dumps(info))
    assert run_lock.saved_step(tmp_path) == 12
    with pytest.raises(ValueError, match=r"holds a finished run \(its model saved at step 12;"):
        run_lock.check_rerun(tmp_path, resume=False, overwrite=False)
    (tmp_path / "adapter_model.safetensors").unlink()
    assert run_lock.saved_step(tmp_path) is None  # grpo_run.json alone: no model saved


def test_live_run_names_the_run_a_checkpoint_belongs_to(tmp_path):
    out = tmp_path / "run"
    (out / "checkpoint-2").mkdir(parents=True)
    assert run_lock.live_run(out) is None
    with held_lock(out) as pid:
        for path in (out, out / "checkpoint-2"):
            root, holder = run_lock.live_run(path)
            assert root == out and holder.startswith(f"pid {pid} on here")
        assert run_lock.live_run(tmp_path) is None
