"""One run per output directory: a held lock refuses a second run, a killed holder frees it, a
rerun must resume or overwrite, and overwriting deletes only what a run wrote."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from grpo_plugin.training.run import lock as run_lock

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
