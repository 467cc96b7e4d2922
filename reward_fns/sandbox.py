"""Run untrusted Python in a fresh, limited, isolated process (used by ``code_tests``).

Sandbox: one fresh process per stdin/stdout case, one per assert block.

- Always: own session (``setsid``), everything it started killed at the end; wall-clock
  timeout plus ``RLIMIT_CPU``; ``RLIMIT_AS`` memory cap; ``RLIMIT_NPROC``; ``RLIMIT_FSIZE``
  caps stdout and any file written; stdin is ``/dev/null`` (or the case's input); environment
  scrubbed to a minimal ``PATH`` (no ``HF_TOKEN``...); ``python -I -S`` (no site-packages);
  a fresh temporary working directory, deleted afterwards.
- Mode ``namespaces`` (root and util-linux ``unshare`` working, as on the project's machines):
  new network namespace (a downed loopback only: no network, not even 127.0.0.1); new mount
  namespace where every mount is read-only and ``nosuid`` except the working directory; new
  PID namespace with its own ``/proc`` (host processes are invisible and cannot be signalled);
  new IPC/UTS namespaces; a throwaway uid with no capabilities and ``no_new_privs``, so
  ``RLIMIT_NPROC`` really binds and a fork bomb stays small.
- Mode ``rlimits`` (fallback, logged as a warning): the "always" list only. Network and
  filesystem are NOT isolated. As root the code still runs under a throwaway uid (it needs a
  world-readable ``python3``, else this mode refuses); as a normal user it runs as that user,
  so it may signal that user's processes and a process calling ``setsid`` can outlive the run.

Not defended against: CPU contention during the timeout, and a program written to forge its
own assert results (it shares the harness's interpreter). bubblewrap is not used: it is not
installed on the project's machines and ``unshare`` covers the same ground here.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache

logger = logging.getLogger("reward_fns.code")

UID_BASE = 0x3000_0000  # throwaway uids: UID_BASE + random, never a real account
_SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
_UNSHARE = ["--net", "--mount", "--pid", "--ipc", "--uts", "--fork", "--kill-child"]
_UNSHARE += ["--mount-proc", "--propagation", "private"]

_BOOTSTRAP = r"""
import ctypes, json, os, resource, sys
spec = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
KEEP = {"nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048,
        "relatime": 1 << 21, "strictatime": 1 << 24}
def mount(src, dst, flags):
    if libc.mount(src and src.encode(), dst.encode(), None, flags, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), dst)
if spec["namespaces"]:
    mount(spec["work"], spec["work"], 4096 | 16384)
    if spec["bind_prefix"]:
        mount(spec["bind_prefix"], spec["prefix_target"], 4096 | 16384)
    for line in open("/proc/self/mountinfo").read().splitlines():
        fields = line.split()
        point = fields[4].encode().decode("unicode_escape")
        if point != spec["work"]:
            flags = 32 | 4096 | 1 | 2  # MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID
            for opt in fields[5].split(","):
                flags |= KEEP.get(opt, 0)
            mount(None, point, flags)
for name, value in spec["limits"].items():
    resource.setrlimit(getattr(resource, name), tuple(value))
if spec["uid"] is not None:
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    os.setgroups([])
    os.setgid(spec["uid"])
    os.setuid(spec["uid"])
os.chdir(spec["work"])
if not spec["namespaces"] and os.fork():  # stay as the parent, so getppid() is not the trainer
    _, status = os.wait()
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
os.execve(spec["argv"][0], spec["argv"], spec["env"])
"""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits: wall clock, memory (address space), processes, output bytes."""

    timeout_s: float = 5.0
    memory_mb: int = 1024
    max_processes: int = 32
    max_output_bytes: int = 1 << 20


@dataclass
class RunResult:
    """What one sandboxed run left behind (stdout and stderr capped)."""

    returncode: int | None
    stdout: str
    timed_out: bool
    results: str = ""  # the assert harness's P/F lines
    stderr: str = ""


def _world_accessible(path: str) -> bool:
    """Whether any uid can reach and execute ``path`` (o+x on every directory on the way)."""
    path = os.path.realpath(path)
    parts = path.split(os.sep)
    for i in range(2, len(parts) + 1):
        if not os.stat(os.sep.join(parts[:i]) or os.sep).st_mode & 0o001:
            return False
    return True


def _interpreter(namespaces: bool) -> tuple[str, str | None]:
    """The interpreter for sandboxed code and, if a throwaway uid cannot reach it, a prefix to bind.

    Without namespaces nothing can be bound, so a world-reachable ``python3`` from the minimal
    PATH is used instead (the code only needs the standard library).
    """
    real = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    if _world_accessible(real):
        return real, None
    if namespaces and real.startswith(prefix + os.sep):
        return real, prefix
    system = shutil.which("python3", path=_SAFE_PATH)
    if system and _world_accessible(system):
        return os.path.realpath(system), None
    return real, prefix


def _limits(limits: SandboxLimits) -> dict[str, list[int]]:
    cpu = math.ceil(limits.timeout_s) + 1
    memory = limits.memory_mb << 20
    return {
        "RLIMIT_AS": [memory, memory],
        "RLIMIT_CPU": [cpu, cpu + 1],
        "RLIMIT_NPROC": [limits.max_processes, limits.max_processes],
        "RLIMIT_FSIZE": [limits.max_output_bytes, limits.max_output_bytes],
        "RLIMIT_CORE": [0, 0],
        "RLIMIT_NOFILE": [256, 256],
    }


def _processes_of(uid: int) -> list[int]:
    """Live (non-zombie) processes whose real uid is ``uid``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                status = f.read()
        except OSError:
            continue
        match = re.search(r"^Uid:\s+(\d+)", status, re.MULTILINE)
        zombie = re.search(r"^State:\s+Z", status, re.MULTILINE)  # dead; init reaps it
        if match and int(match.group(1)) == uid and not zombie:
            pids.append(int(entry))
    return pids


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait up to ``timeout`` s; True when it exited. A pidfd avoids ``Popen.wait``'s polling."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd (old kernel or not Linux): poll
        try:
            proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        select.select([pidfd], [], [], timeout)
    finally:
        os.close(pidfd)
    return proc.poll() is not None


def _reap(proc: subprocess.Popen[bytes], uid: int | None) -> None:
    """Kill everything the run started, so that nothing outlives it, not even a zombie.

    With a throwaway uid, its processes are killed first: the namespace's init dies, the kernel
    kills the rest of the namespace, and ``unshare`` reaps them before exiting (killing
    ``unshare`` first would orphan them to the host's init). Then the process group goes.
    """
    deadline = time.monotonic() + 5.0
    while True:
        stray = _processes_of(uid) if uid is not None else []
        for pid in stray:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        late = time.monotonic() > deadline
        if not stray or late:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if uid is None or late:
            proc.wait()
            if stray:
                logger.warning("code_tests sandbox: processes %s outlived their run", stray)
            return
        if proc.poll() is not None and not stray:
            return
        time.sleep(0.005)


def run_python(
    files: dict[str, str],
    args: list[str],
    stdin_text: str | None = None,
    limits: SandboxLimits = SandboxLimits(),
    mode: str = "auto",
) -> RunResult:
    """Run ``python -I -S <args>`` in the sandbox; ``files`` are written next to the program.

    ``args`` may use ``{dir}`` (where ``files`` are) and ``{fd}`` (a result descriptor).
    """
    mode = sandbox_mode() if mode == "auto" else mode
    outer = tempfile.mkdtemp(prefix="reward_fns-")
    try:
        return _run_in(outer, files, args, stdin_text, limits, mode)
    finally:
        shutil.rmtree(outer, ignore_errors=True)


@dataclass
class _Plan:
    work: str
    python: str
    prefix: str | None
    uid: int | None
    env: dict[str, str]


def _prepare(outer: str, files: dict[str, str], namespaces: bool) -> _Plan:
    """Lay out ``outer`` (programs, private io/, the code's work/) and pick uid and interpreter."""
    os.chmod(outer, 0o755)
    work = os.path.join(outer, "work")
    os.mkdir(work, 0o700)
    os.mkdir(os.path.join(outer, "io"), 0o700)
    for name, text in files.items():
        with open(os.path.join(outer, name), "w", encoding="utf-8") as f:
            f.write(text)
    python, prefix = _interpreter(namespaces)
    uid = None
    if os.geteuid() == 0:
        if not namespaces and prefix:
            raise RuntimeError(
                "code_tests cannot drop root for generated code: no world-readable python3 "
                "and no working `unshare`; run as a non-root user or enable namespaces"
            )
        uid = UID_BASE + secrets.randbelow(1 << 24)
        os.chown(work, uid, uid)
    env = {"PATH": _SAFE_PATH, "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8"}
    if namespaces and prefix:
        target = os.path.join(outer, "py")
        os.mkdir(target)
        python = os.path.join(target, os.path.relpath(python, prefix))
        env["LD_LIBRARY_PATH"] = os.path.join(target, "lib")
    return _Plan(work, python, prefix if namespaces else None, uid, env)


def _run_in(
    outer: str,
    files: dict[str, str],
    args: list[str],
    stdin_text: str | None,
    limits: SandboxLimits,
    mode: str,
) -> RunResult:
    namespaces = mode == "namespaces"
    plan = _prepare(outer, files, namespaces)
    io = os.path.join(outer, "io")
    with open(os.path.join(io, "stdin"), "w", encoding="utf-8") as f:
        f.write(stdin_text or "")
    with (
        open(os.path.join(io, "stdin"), "rb") as stdin,
        open(os.path.join(io, "stdout"), "wb") as stdout,
        open(os.path.join(io, "stderr"), "wb") as stderr,
        open(os.path.join(io, "results"), "wb") as results,
    ):
        argv = [plan.python, "-I", "-S"] + [a.format(dir=outer, fd=results.fileno()) for a in args]
        spec = {"namespaces": namespaces, "work": plan.work, "uid": plan.uid, "argv": argv}
        spec.update(env=plan.env, limits=_limits(limits), bind_prefix=plan.prefix)
        spec["prefix_target"] = os.path.join(outer, "py")
        boot = [os.path.realpath(sys.executable), "-I", "-S", "-c", _BOOTSTRAP, json.dumps(spec)]
        proc = subprocess.Popen(
            ["unshare", *_UNSHARE, *boot] if namespaces else boot,
            stdin=stdin if stdin_text is not None else subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            env={"PATH": _SAFE_PATH},
            cwd=plan.work,
            start_new_session=True,
            pass_fds=(results.fileno(),),
        )
        timed_out = not _wait(proc, limits.timeout_s)
        _reap(proc, plan.uid)
    return RunResult(
        proc.returncode,
        _read(os.path.join(io, "stdout"), limits.max_output_bytes),
        timed_out,
        _read(os.path.join(io, "results")),
        _read(os.path.join(io, "stderr"), 1 << 16),
    )


def _read(path: str, limit: int = 1 << 20) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", errors="replace")


@lru_cache(maxsize=1)
def sandbox_mode() -> str:
    """``namespaces`` when root and ``unshare`` work here (checked once), else ``rlimits``."""
    why = "not running as root"
    if os.geteuid() == 0 and shutil.which("unshare"):
        probe = run_python({"p.py": "import os\nprint(os.getuid())\n"}, ["{dir}/p.py"],
                           limits=SandboxLimits(timeout_s=30.0), mode="namespaces")  # fmt: skip
        if probe.returncode == 0 and probe.stdout.strip().isdigit():
            return "namespaces"
        why = f"unshare probe failed (exit code {probe.returncode}: {probe.stderr[-300:]!r})"
    logger.warning(
        "code_tests sandbox: %s; falling back to rlimits only - NO network or filesystem "
        "isolation for generated code", why
    )  # fmt: skip
    return "rlimits"
