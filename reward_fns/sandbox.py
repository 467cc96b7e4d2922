"""Run untrusted Python in a fresh, limited, isolated process tree (used by ``code_tests``).

Isolation levels (``isolation=``; the active one is logged once per process):

- ``bwrap``: bubblewrap (Debian: ``apt-get install bubblewrap``) builds the minimal root of
  :mod:`reward_fns.sandbox_root` (interpreter and stdlib read-only, empty tmpfs ``/work``,
  ``/dev/null``, ``/dev/urandom``, private ``/proc``; no home, checkout, host ``/tmp``,
  site-packages beyond an allow-list, or ``/etc``) in new mount, PID, network, IPC and UTS
  namespaces. Needs root.
- ``pivot_root``: the same root and namespaces, made by :mod:`reward_fns._sandbox_init` itself
  (``unshare(2)``, mounts, ``pivot_root(2)``). Needs root. At both root levels a seccomp filter
  keeps the program from making a user namespace of its own
  (:func:`reward_fns._sandbox_init.forbid_user_namespaces`).
- ``bwrap-user``: the same root and namespaces, built by bubblewrap without root, in a user
  namespace of its own (``--unshare-user --cap-drop ALL``; needs unprivileged user namespaces).
  Everything runs under the trainer's one uid, so instead of a second uid the program runs in
  a nested user and PID namespace with its own ``/proc``, as PID 2 under an undumpable PID 1
  (:func:`reward_fns._sandbox_init.own_namespaces`): the judge, the supervisor and the host's
  processes have no PID there, so the program can neither signal, trace nor read them, and no
  capability is left. Only for the non-root user (as root, ``bwrap`` gives two uids).
- ``rlimits``: no root and no namespaces (logged as a warning): the host's files are readable
  and the work directory is a host temporary folder.

``auto`` takes the first of these that works here; ``strict`` does too but refuses ``rlimits``
(every other level is a minimal root with a verdict the program cannot reach).

Limits for the whole run (memory, task count) come from a cgroup when we can make one
(:mod:`reward_fns.sandbox_cgroup`; usually only as root), else from per-process rlimits only;
the log line says which. At ``bwrap-user`` ``RLIMIT_NPROC`` still caps the program's whole
process tree (the kernel counts it per user namespace, and the program has its own), but
``memory_mb`` holds per process.
Always: wall-clock timeout and ``RLIMIT_CPU``; ``RLIMIT_AS``, ``RLIMIT_NPROC``, ``RLIMIT_FSIZE``,
``RLIMIT_NOFILE`` per process; no core dumps; an environment with ``PATH`` and little else; the
program's stdin, stdout and stderr and the judge's verdicts in memfds (nothing lands on the
host's ``/tmp``); as root, two throwaway uids, one for the program and one for the judge
(:mod:`reward_fns._code_harness`), so the program can neither signal, trace nor read the judge.

Not defended: CPU contention during the timeout. At ``bwrap-user`` without a cgroup also the
memory of the whole run (``memory_mb`` per process, plus memfds of up to ``max_output_bytes``
each). At ``rlimits`` also the host filesystem (read), disk use beyond the per-file cap, and, as
a non-root user, the trainer itself (its memory and descriptors: a verdict can be forged), the
user's other processes (signals) and a ``setsid`` child outliving the run.
"""

from __future__ import annotations

import logging
import marshal
import math
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache

from reward_fns import _code_harness, sandbox_cgroup, sandbox_launch
from reward_fns.sandbox_launch import IsolationError

logger = logging.getLogger("reward_fns.code")

UID_BASE = 0x3000_0000  # throwaway uids: UID_BASE + random, never a real account
LEVELS = ("bwrap", "pivot_root", "bwrap-user", "rlimits")
ISOLATIONS = ("auto", "strict", *LEVELS)


@dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits. With a cgroup, ``memory_mb`` and ``max_processes`` hold for the whole
    run; they are also each process's ``RLIMIT_AS`` and its uid's ``RLIMIT_NPROC``."""

    timeout_s: float = 5.0
    memory_mb: int = 1024
    max_processes: int = 32
    max_output_bytes: int = 1 << 20
    workdir_mb: int = 64
    max_open_files: int = 256


@dataclass
class RunResult:
    """What one sandboxed run left behind (stdout and stderr capped)."""

    returncode: int | None
    stdout: str
    timed_out: bool
    verdicts: list[bool] | None = None  # the judge's, one per assert; None: no complete verdict
    stderr: str = ""
    oom_kills: int = 0


def run_python(
    code: str,
    stdin_text: str | None = None,
    tests: str | None = None,
    limits: SandboxLimits = SandboxLimits(),
    isolation: str = "auto",
    packages: Sequence[str] = (),
) -> RunResult:
    """Run ``code`` as ``__main__`` in the sandbox; with ``tests`` (Python source whose top-level
    asserts are the tests), a judge the program cannot reach evaluates them."""
    return _run(isolation_level(isolation), code, stdin_text, tests, limits, tuple(packages))


def _run(level, code, stdin_text, tests, limits: SandboxLimits, packages) -> RunResult:
    cgroup_setup = sandbox_cgroup.hierarchy()
    with _Files() as files:
        uids = _throwaway_uids()
        spec = {**sandbox_launch.static_spec(level, packages, limits.workdir_mb)}
        spec.update(code=code, uids=uids)
        own_tasks = uids is None and level == "rlimits"
        spec["limits"] = _rlimits(limits, shared_uid=own_tasks, namespace=level == "bwrap-user")
        if level == "rlimits":
            spec.update(sandbox_launch.host_work(uids))
            files.folders.append(spec["work"])
        judged = _judge_input(tests) if tests is not None else None
        spec["tests_fd"] = files.memfd("tests", judged) if judged is not None else None
        spec["results_fd"] = files.memfd("results", b"") if tests is not None else None
        cgroup = None
        if cgroup_setup is not None:
            tasks = limits.max_processes + 3  # + the outside waiter, _sandbox_init, the judge
            cgroup = files.cgroup = sandbox_cgroup.RunCgroup(
                cgroup_setup, limits.memory_mb << 20, tasks
            )
        bwrap = level in sandbox_launch.BWRAP_LEVELS
        spec["cgroup_procs"] = cgroup.procs_files() if cgroup and not bwrap else []
        spec_fd = files.memfd("spec", marshal.dumps(spec))
        argv = sandbox_launch.command(level, packages, limits.workdir_mb, spec_fd)
        if cgroup is not None and bwrap:
            argv = cgroup.wrap(argv)
        stdout, stderr = files.memfd("stdout", b""), files.memfd("stderr", b"")
        stdin = files.memfd("stdin", stdin_text.encode()) if stdin_text is not None else None
        proc = subprocess.Popen(
            argv,
            stdin=stdin if stdin is not None else subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            env={"PATH": sandbox_launch.SAFE_PATH},
            cwd="/",
            start_new_session=True,
            pass_fds=tuple(fd for fd in (spec_fd, spec["tests_fd"], spec["results_fd"]) if fd),
        )
        timed_out = not sandbox_launch.wait(proc, limits.timeout_s)
        sandbox_launch.reap(proc, cgroup, uids, level)
        results = _read(spec["results_fd"], 1 << 20) if tests is not None else ""
        return RunResult(
            returncode=proc.returncode,
            stdout=_read(stdout, limits.max_output_bytes),
            timed_out=timed_out,
            verdicts=_verdicts(results) if tests is not None and not timed_out else None,
            stderr=_read(stderr, 1 << 16),
            oom_kills=cgroup.oom_kills() if cgroup is not None else 0,
        )


_judge_input = lru_cache(maxsize=256)(_code_harness.compile_tests)  # a group shares its tests


class _Files:
    """The run's descriptors, host work folder and cgroup, all released on exit."""

    def __init__(self) -> None:
        self.fds: list[int] = []
        self.folders: list[str] = []
        self.cgroup: sandbox_cgroup.RunCgroup | None = None

    def __enter__(self) -> _Files:
        return self

    def memfd(self, name: str, data: bytes) -> int:
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create(f"reward_fns-{name}")
        else:  # not Linux: an unnamed temporary file
            fd = os.dup((f := tempfile.TemporaryFile()).fileno())
            f.close()
        self.fds.append(fd)
        while data:
            data = data[os.write(fd, data) :]
        os.lseek(fd, 0, os.SEEK_SET)
        return fd

    def __exit__(self, *exc: object) -> None:
        for fd in self.fds:
            os.close(fd)
        for folder in self.folders:
            shutil.rmtree(folder, ignore_errors=True)
        if self.cgroup is not None:
            self.cgroup.remove()


def _throwaway_uids() -> tuple[int, int] | None:
    """Two distinct never-used uids (program, judge) when we can switch uid, else None."""
    if os.geteuid() != 0:
        return None
    program = UID_BASE + secrets.randbelow(1 << 24)
    return program, program + 1 + secrets.randbelow(1 << 20)


def _own_task_count() -> int:
    """Tasks (threads included) of this uid on the machine: what RLIMIT_NPROC counts."""
    uid, count = os.getuid(), 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry.name}/task"))
            except OSError:
                continue
    return count


def _rlimits(
    limits: SandboxLimits, shared_uid: bool = False, namespace: bool = False
) -> dict[str, list[int]]:
    """Per-process limits. At ``rlimits`` without throwaway uids (not root) the program runs as
    the trainer's uid, whose own tasks RLIMIT_NPROC counts too: the cap is then theirs plus
    `max_processes`. At ``bwrap-user`` (``namespace``) the count is that of the program's own
    user namespace, which also holds the supervisor and the namespace's PID 1: 2 more."""
    cpu = math.ceil(limits.timeout_s) + 1
    memory = limits.memory_mb << 20
    processes = limits.max_processes + (_own_task_count() if shared_uid else 0)
    processes += 2 if namespace else 0
    return {
        "RLIMIT_AS": [memory, memory],
        "RLIMIT_CPU": [cpu, cpu + 1],
        "RLIMIT_NPROC": [processes, processes],
        "RLIMIT_FSIZE": [limits.max_output_bytes, limits.max_output_bytes],
        "RLIMIT_CORE": [0, 0],
        "RLIMIT_NOFILE": [limits.max_open_files, limits.max_open_files],
    }


def _verdicts(results: str) -> list[bool] | None:
    lines = results.split()
    return [line == "P" for line in lines[:-1]] if lines[-1:] == ["E"] else None


def _read(fd: int, limit: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, limit).decode("utf-8", errors="replace")


_LOG_LOCK = threading.Lock()


def prepare(isolation: str, packages: Sequence[str], limits: SandboxLimits) -> str:
    """Resolve the level and build what every run of this configuration shares (the root's
    mount list, ``ldd`` of the allowed packages) once, here, so that errors such as an unknown
    package surface in the caller instead of in each worker thread."""
    level = isolation_level(isolation)
    sandbox_launch.static_spec(level, tuple(packages), limits.workdir_mb)
    return level


def isolation_level(isolation: str = "auto") -> str:
    """The level a run with ``isolation`` gets here (logged once per level); raises
    :class:`IsolationError` if none."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {ISOLATIONS}, got {isolation!r}")
    if isolation in LEVELS:
        why = _why_not(isolation)
        if why:
            raise IsolationError(f"code_tests isolation={isolation!r} does not work here: {why}")
        return _announced(isolation)
    level = _best_level()
    if isolation == "strict" and level == "rlimits":
        reasons = "; ".join(f"{lvl}: {_why_not(lvl)}" for lvl in LEVELS[:-1])
        raise IsolationError(
            "code_tests isolation='strict' needs a minimal root and none can be built here: "
            f"{reasons}. Install bubblewrap (apt-get install bubblewrap) and run as root, or as "
            "another user where unprivileged user namespaces are allowed (sysctl "
            "kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0)."
        )
    return _announced(level)


@lru_cache(maxsize=1)
def _best_level() -> str:
    level = next((lvl for lvl in LEVELS if not _why_not(lvl)), None)
    if level is None:
        reasons = "; ".join(f"{lvl}: {_why_not(lvl)}" for lvl in LEVELS)
        raise IsolationError(f"code_tests cannot run generated code here ({reasons})")
    return level


@cache
def _announced(level: str) -> str:
    """Log, once per level and process, which isolation and which limits a run gets."""
    cgroup = sandbox_cgroup.hierarchy()
    limits = cgroup.describe() if cgroup else "per-process rlimits only (no usable cgroup)"
    with _LOG_LOCK:
        if level == "rlimits":
            shared = "" if os.geteuid() == 0 else ", the program shares the judge's uid"
            logger.warning(
                "code_tests sandbox: isolation=rlimits - NO minimal root, NO network isolation%s"
                " (%s), limits=%s",
                shared,
                "; ".join(f"{lvl}: {_why_not(lvl) or 'available'}" for lvl in LEVELS[:-1]),
                limits,
            )
            return level
        apart = "two uids"
        if level == "bwrap-user":
            apart = "one uid, the program alone in its own user and PID namespaces"
            if cgroup is None:
                limits += (
                    ": memory_mb holds per process, max_processes for the program's whole "
                    "process tree (its own user namespace)"
                )
        logger.info(
            "code_tests sandbox: isolation=%s (minimal root: interpreter + stdlib read-only, "
            "tmpfs /work, private /proc, no network; %s), limits=%s",
            level,
            apart,
            limits,
        )
    return level


@cache
def _why_not(level: str) -> str:
    """Why ``level`` cannot run here ('' when it can): tools, then one real probe run."""
    if level == "rlimits":
        try:
            sandbox_launch.rlimits_python()
        except IsolationError as exc:
            return str(exc)
        return ""
    if level == "bwrap-user" and os.geteuid() == 0:
        return "running as root (level bwrap gives the program and the judge two uids)"
    if level != "bwrap-user" and os.geteuid() != 0:
        return "not running as root"
    if level in sandbox_launch.BWRAP_LEVELS and not shutil.which(
        "bwrap", path=sandbox_launch.SAFE_PATH
    ):
        return "bwrap is not installed"
    try:
        code = "import os\nprint(sorted(os.listdir('/')))"
        probe = _run(level, code, None, None, SandboxLimits(timeout_s=30.0), ())
    except (OSError, RuntimeError, ValueError) as exc:
        return f"probe failed: {exc}"
    if probe.returncode != 0 or not probe.stdout.startswith("["):
        return f"probe failed (exit code {probe.returncode}: {probe.stderr[-300:]!r})"
    return ""
