"""One run per output directory: a lock against concurrent runs, and no silent mixing of reruns.

    output_dir/.grpo-plugin.lock     LOCK_FILE: held (flock) by the run's main process

- A second run into a directory whose lock is held is refused with a message naming the holder
  (pid, host, start time). The lock is an `flock`, so a killed run (even `kill -9`) releases it.
- A new run into a directory that already holds a run (metrics, checkpoints, completions, ...)
  is refused unless it resumes (`resume_from_checkpoint`) or `overwrite_output_dir` is set; with
  `overwrite_output_dir` the old run's files are deleted first (other files are left alone), so
  the new run starts clean.
- A directory holding files no run wrote (a project folder, a model folder) is refused before
  anything is written, resumed or overwritten alike, unless `allow_other_files_in_output_dir`;
  a file of the user's under a name a run writes (`README.md`, `recipe.yaml`, ...) is refused
  even then (`ownership.py` says which files are a run's), and so is a symbolic link under such
  a name (`ownership.check_links`).
- What a start that never trained leaves (the evaluation before training, an empty metrics file:
  `nothing_to_lose`) is no run: the plain command starts again there, and clears it first.
- A start that claims the folder first finishes a change of it a kill cut short (`pending.py`:
  a set-aside timeline, a cleared run) and deletes the temporary files a killed writer left.

The lock is re-entrant within a process: the recipe pipeline claims the directory before any model
loads, and `GRPOTrainer.train()` (which claims it for Python users) then finds it held.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import socket
import time
from pathlib import Path

from . import checkpoints, ownership, pending, rundir, timeline

logger = logging.getLogger(__name__)

LOCK_FILE = rundir.LOCK_FILE
_HELD: dict[str, RunLock] = {}


class OutputDirInUse(RuntimeError):
    """Another run holds the output directory."""


def _key(output_dir: str | Path) -> str:
    return os.path.realpath(output_dir)


# What a run's start writes before its first step, with no record of training in it.
_START_ONLY = frozenset(
    {LOCK_FILE, rundir.STAGING_DIR, rundir.PENDING_FILE, rundir.EVAL_FILE}
    | {rundir.METRICS_FILE, rundir.COMPLETIONS_DIR}
)


def _no_record(path: Path) -> bool:
    """Whether a run's start-only entry holds nothing a run would lose."""
    name = path.name
    if name == rundir.EVAL_FILE:  # the evaluation before training: a new run computes it again
        try:
            return set(rundir.read_json(path) or {}) <= set(rundir.EVAL_BEFORE_KEYS)
        except ValueError:  # not JSON: not for this check to decide what it held
            return False
    if name == rundir.METRICS_FILE:
        return not rundir.read_metrics(path.parent)
    if name == rundir.COMPLETIONS_DIR:
        return not any(rundir.temporary_of(p.name) is None for p in path.iterdir())
    return True


def nothing_to_lose(output_dir: str | Path) -> bool:
    """Whether what a run wrote in `output_dir` is only what a start that never trained leaves
    (no checkpoint, no weights, no metrics line, no completions table, eval.json with the
    evaluation before training at most): a new run may start there without overwrite_output_dir."""
    root = Path(output_dir)
    for name in ownership.run_entries(root):
        if rundir.temporary_of(name) is not None:
            continue  # a file a kill left half written
        if name not in _START_ONLY or not _no_record(root / name):
            return False
    return True


def previous_run_files(output_dir: str | Path) -> list[str]:
    """The names of the files and folders that show an earlier run in `output_dir` ([] when
    none, or when it left nothing to lose: `nothing_to_lose`)."""
    root = Path(output_dir)
    if not ownership.shows_run(root) or nothing_to_lose(root):
        return []
    ours = set(ownership.run_entries(root))
    found = [name for name in rundir.RUN_MARKERS if name in ours]
    return found + [p.name for p in checkpoints.checkpoints(root)]


def saved_step(output_dir: str | Path) -> int | None:
    """The step of the model a run saved at the top of `output_dir` (its weights beside its
    grpo_run.json): a run trained to its end, whose checkpoints may be rotated away or never
    written (`save_strategy: no`); None when there is none."""
    root = Path(output_dir)
    if not any((root / name).is_file() for name in checkpoints.WEIGHT_FILES):
        return None
    if rundir.RUN_INFO_FILE not in ownership.run_entries(root):
        return None
    try:
        info = rundir.read_json(root / rundir.RUN_INFO_FILE) or {}
    except ValueError:
        return None
    step = info.get("global_step")
    return step if isinstance(step, int) else None


def check_rerun(
    output_dir: str | Path,
    resume: bool,
    overwrite: bool,
    found: list[str] | None = None,
    others_ok: bool = False,
) -> None:
    """Refuse (ValueError, one line) a run into a directory holding files no run wrote (unless
    `others_ok`, and never over one of them), and a new run into a directory that holds another
    run (`found`: that run's files, when they were listed earlier; else they are listed now)."""
    ownership.check_links(output_dir)
    ownership.check_others(output_dir, others_ok)
    if resume or overwrite:
        return
    found = previous_run_files(output_dir) if found is None else found
    shown = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
    saved = saved_step(output_dir) if found else None
    if found and saved is not None and not checkpoints.has_complete(output_dir):
        raise ValueError(
            f"output_dir {output_dir} holds a finished run (its model saved at step {saved}; no "
            "checkpoint is kept to go on from): train again with --overwrite_output_dir (it "
            "deletes that run's files), or choose another output_dir."
        )
    if found and not checkpoints.has_complete(output_dir):  # nothing to resume: one way out
        raise ValueError(
            f"output_dir {output_dir} holds a run with no complete checkpoint to resume from "
            f"({shown}); start over with --overwrite_output_dir (it deletes that run's files), "
            "or choose another output_dir."
        )
    if found:
        raise ValueError(
            f"output_dir {output_dir} already holds a run ({shown}); resume it with "
            "--resume_from_checkpoint true, replace it with --overwrite_output_dir, or choose "
            "another output_dir."
        )


def clear_previous_run(output_dir: str | Path) -> list[str]:
    """Delete an earlier run's files and folders (only what a run wrote, `ownership.py`, and only
    when the directory shows a run, or holds what a start left: `nothing_to_lose`); returns
    their names. Everything is checked first (a symbolic link among them is refused), and the
    deletion is recorded before it starts (`pending.py`): a kill half way is finished by the
    next start, so no half of the old run is ever taken for a run."""
    root = Path(output_dir)
    if not ownership.shows_run(root) and not (root.is_dir() and nothing_to_lose(root)):
        return []
    ownership.check_links(root)
    removed = [name for name in ownership.run_entries(root) if name != LOCK_FILE]
    removed = [name for name in removed if name != rundir.PENDING_FILE]
    if not removed:
        return []
    pending.begin(root, {"change": "clear", "remove": removed})
    _remove(root, removed)
    pending.done(root)
    logger.info("Removed the previous run's %s", ", ".join(removed))
    return removed


def _remove(root: Path, names: list[str]) -> None:
    """Delete each entry (again: one already gone is done); a link is unlinked, never followed."""
    for name in names:
        path = root / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def finish_pending(output_dir: str | Path) -> None:
    """Finish a change of the folder a kill cut short (`pending.py`); under the lock."""
    root = Path(output_dir)
    change = pending.read(root)
    if change is None:
        return
    kind = change.get("change")
    if kind == "set_aside":
        timeline.finish(root, change)
    elif kind == "clear":
        _remove(root, change["remove"])
        pending.done(root)
        logger.warning("Finished deleting the previous run's files, which a kill cut short.")
    else:
        raise ValueError(
            f"{pending.path(root)} records a change this version does not know ({kind!r}); "
            "nothing was changed: delete the file, or use the grpo-plugin version that wrote it."
        )


def _tidy(output_dir: str | Path) -> None:
    """What a kill left: a recorded change finished, the temporary files of dead writers removed."""
    finish_pending(output_dir)
    for folder in (Path(output_dir), Path(output_dir) / rundir.COMPLETIONS_DIR):
        rundir.remove_stale_temporaries(folder)


class RunLock:
    """An exclusive, non-blocking `flock` on `output_dir/.grpo-plugin.lock`."""

    def __init__(self, output_dir: str | Path):
        self.path = Path(output_dir) / LOCK_FILE
        self.fd: int | None = None
        self.depth = 0

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise OutputDirInUse(
                    f"output_dir {self.path.parent} is in use by another run ({holder}); wait for "
                    "it to finish, or choose another output_dir."
                ) from None
            if _same_file(fd, self.path):
                break
            os.close(fd)  # the lock file was removed by a run that just ended: lock the new one
        os.ftruncate(fd, 0)
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.ctime()}
        os.write(fd, json.dumps(info).encode())
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            self.path.unlink(missing_ok=True)  # while still locked: no one else holds this file
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = None


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {info['pid']} on {info['host']}, started {info['started']}"
    except (ValueError, KeyError, OSError):
        return "holder unknown"


def claim(
    output_dir: str | Path,
    *,
    resume: bool,
    overwrite: bool,
    found: list[str] | None = None,
    others_ok: bool = False,
) -> RunLock:
    """Lock `output_dir` for this process's run (re-entrant) and apply the rerun rule (`found`:
    the earlier run's files as listed before this run wrote anything; default: listed now;
    `others_ok`: `allow_other_files_in_output_dir`)."""
    key = _key(output_dir)
    held = _HELD.get(key)
    if held is not None:
        held.depth += 1
        return held
    lock = RunLock(output_dir)
    lock.acquire()
    try:
        ownership.check_links(output_dir)  # before a change a kill cut short is finished
        _tidy(output_dir)
        check_rerun(output_dir, resume, overwrite, found, others_ok)
        if not resume and (overwrite or nothing_to_lose(output_dir)):
            clear_previous_run(output_dir)
    except BaseException:
        lock.release()
        raise
    lock.depth = 1
    _HELD[key] = lock
    return lock


def release(output_dir: str | Path) -> None:
    """Undo one `claim`; the lock goes when the last one is undone."""
    key = _key(output_dir)
    held = _HELD.get(key)
    if held is None:
        return
    held.depth -= 1
    if held.depth <= 0:
        held.release()
        del _HELD[key]


def lock_holder(output_dir: str | Path) -> str | None:
    """Who holds the directory's lock ("pid 12 on host, started ..."); None when no other process
    does (nothing is taken)."""
    path = Path(output_dir) / LOCK_FILE
    if is_claimed(output_dir):
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:  # no run, or one that just ended
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read_holder(fd)
    finally:
        os.close(fd)
    return None


def live_run(path: str | Path) -> tuple[Path, str] | None:
    """(the run folder, who holds its lock) when `path` is a run folder, or a checkpoint-N folder
    of one, that another process is training in now; None otherwise (nothing is taken). For the
    commands that read a run (`export`, `publish`): its top-level weights are an older save, or
    none, until the run ends."""
    path = Path(path)
    for root in (path, path.parent) if checkpoints.checkpoint_step(path) is not None else (path,):
        holder = lock_holder(root)
        if holder is not None:
            return root, holder
    return None


def check_not_in_use(output_dir: str | Path) -> None:
    """Raise `OutputDirInUse` when another process holds the directory's lock (nothing is taken)."""
    holder = lock_holder(output_dir)
    if holder is not None:
        raise OutputDirInUse(
            f"output_dir {output_dir} is in use by another run ({holder}); wait for it "
            "to finish, or choose another output_dir."
        )


def is_claimed(output_dir: str | Path) -> bool:
    return _key(output_dir) in _HELD


__all__ = [
    "LOCK_FILE",
    "OutputDirInUse",
    "RunLock",
    "check_not_in_use",
    "check_rerun",
    "claim",
    "clear_previous_run",
    "is_claimed",
    "finish_pending",
    "lock_holder",
    "nothing_to_lose",
    "previous_run_files",
    "release",
    "saved_step",
]
