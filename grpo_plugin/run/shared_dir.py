"""One output_dir for every machine: checked before the run writes anything, and named in one
line on every process when it is not.

Process 0 writes the run (metrics, completions, the adapter), but every process writes its own RNG
and trainer state into each checkpoint and reads them back on resume: `output_dir` must be the
same folder on every machine. A local path on each machine is the usual mistake; unchecked, the
run trains and then fails at the first checkpoint, or resumes each machine from another state.

    process 0      writes  output_dir/.grpo-plugin-shared-NONCE     (NONCE: random, new each time)
    process K > 0  reads it back, then writes its answer  ...-NONCE.K
    process 0      removes both, once every process has answered (a gather)

A process that does not find process 0's file (within GRACE_S, for filesystems that show a new
file late) does not share the folder; one that cannot write its answer could not write its part
of a checkpoint. Either way every process raises the same one-line ValueError, naming the folder,
the processes and their hosts, and the fix. The file names are `rundir.SHARED_CHECK_PREFIX`'s;
the nonce keeps them apart from any other run's (the check runs before the lock is taken).
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from ..distributed import gather_objects, on_main_process
from . import rundir

GRACE_S = 2.0  # how long a process waits for process 0's file to show up
_POLL_S = 0.1


@dataclass(frozen=True)
class Answer:
    """What one process found: its host, whether it read process 0's file, why it could not
    write its own (None: it could)."""

    host: str
    sees: bool
    write_error: str | None = None


def token_path(output_dir: str | Path, nonce: str, rank: int = 0) -> Path:
    """Process 0's file (`rank` 0) or process `rank`'s answer."""
    name = f"{rundir.SHARED_CHECK_PREFIX}{nonce}" + (f".{rank}" if rank else "")
    return Path(output_dir) / name


def check_shared(output_dir: str | Path, accelerator) -> None:
    """Raise ValueError (one line, the same on every process) unless every process sees and can
    write the same `output_dir`. A collective (three small gathers); nothing to do on one process."""
    if accelerator is None or accelerator.num_processes == 1:
        return
    root, rank = Path(output_dir), accelerator.process_index
    created = rank == 0 and not root.exists()
    nonce = on_main_process(accelerator, lambda: _write_token(root))
    answers = gather_objects(accelerator, _answer(root, nonce, rank))
    if rank == 0:
        _clean_up(root, nonce, len(answers), created)
    problem = describe_problem(output_dir, answers)
    if problem:
        raise ValueError(problem)


def _write_token(root: Path) -> str:
    nonce = secrets.token_hex(8)
    try:
        root.mkdir(parents=True, exist_ok=True)
        rundir.write_text_atomic(token_path(root, nonce), nonce)
    except OSError as err:
        raise ValueError(
            f"output_dir {root} cannot be written by process 0 ({err.strerror}); choose a "
            "writable output_dir."
        ) from None
    return nonce


def _answer(root: Path, nonce: str, rank: int) -> Answer:
    host = socket.gethostname()
    if rank == 0:
        return Answer(host, sees=True)
    if not _wait_for(token_path(root, nonce), nonce):
        return Answer(host, sees=False)
    try:
        token_path(root, nonce, rank).write_text(nonce)
    except OSError as err:
        return Answer(host, sees=True, write_error=err.strerror or type(err).__name__)
    return Answer(host, sees=True)


def _wait_for(path: Path, nonce: str) -> bool:
    deadline = time.monotonic() + GRACE_S
    while True:
        try:
            if path.read_text() == nonce:
                return True
        except OSError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)


def _clean_up(root: Path, nonce: str, world: int, created: bool) -> None:
    for rank in range(world):
        token_path(root, nonce, rank).unlink(missing_ok=True)
    if created:  # leave no empty folder behind (a --dry-run, a refused run); the run recreates it
        try:
            os.rmdir(root)
        except OSError:
            pass


def _who(ranks: list[int], answers: list[Answer]) -> str:
    shown = ", ".join(f"{k} ({answers[k].host})" for k in ranks[:4])
    more = f" and {len(ranks) - 4} more" if len(ranks) > 4 else ""
    return f"process{'es' if len(ranks) > 1 else ''} {shown}{more}"


def describe_problem(output_dir: str | Path, answers: list[Answer]) -> str | None:
    """The one-line error for these answers (process k's at index k), or None when all is well."""
    blind = [k for k, a in enumerate(answers) if not a.sees]
    if blind:
        return (
            f"output_dir {output_dir} is not one folder shared by every machine: "
            f"{_who(blind, answers)} cannot see the file process 0 ({answers[0].host}) wrote "
            "there. Every process writes into each checkpoint and reads it back on resume: put "
            "output_dir on a filesystem every machine mounts at the same path (NFS, Lustre, a "
            "cloud file share) and pass that path on every machine."
        )
    unwritable = [k for k, a in enumerate(answers) if a.write_error]
    if unwritable:
        error = answers[unwritable[0]].write_error
        return (
            f"output_dir {output_dir} is shared, but {_who(unwritable, answers)} cannot write "
            f"there ({error}); every process writes into each checkpoint: make output_dir "
            "writable from every machine."
        )
    return None
