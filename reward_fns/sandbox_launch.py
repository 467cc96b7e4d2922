"""How each isolation level starts a run (its command line and the fixed part of its spec),
and how a run is waited for and stopped.

``bwrap`` runs ``bwrap`` with the root of :mod:`reward_fns.sandbox_root` and starts
``_sandbox_init`` inside it; ``pivot_root`` and ``rlimits`` start ``_sandbox_init`` directly (at
``pivot_root`` it makes the namespaces and the root itself). At ``rlimits`` as root the program
runs under a throwaway uid that must read the standard library; pyenv puts it under ``/root``
(mode 700), so this level then uses the system ``python3``, as the previous sandbox did.
"""

from __future__ import annotations

import logging
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from functools import lru_cache

from reward_fns import sandbox_root

logger = logging.getLogger("reward_fns.code")
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
HERE = os.path.dirname(os.path.abspath(__file__))
BWRAP = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--die-with-parent"]
BWRAP += ["--as-pid-1", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
BWRAP += ["--cap-add", "CAP_CHOWN", "--chdir", "/"]
BWRAP_USER = ["--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
BWRAP_USER += ["--die-with-parent", "--as-pid-1", "--cap-drop", "ALL", "--chdir", "/"]
BWRAP_LEVELS = ("bwrap", "bwrap-user")  # bubblewrap builds the root


class IsolationError(RuntimeError):
    """The requested isolation cannot be built on this machine."""


@lru_cache(maxsize=32)
def static_spec(level: str, packages: tuple[str, ...], workdir_mb: int) -> dict:
    """The part of _sandbox_init's spec that is the same for every run of a configuration."""
    if level == "rlimits":  # the interpreter's own sys.path, plus the allowed packages' folders
        extra = [os.path.dirname(_package_dir(name)) for name in packages]
        return {
            "level": level,
            "packages": list(packages),
            "mounts": [],
            "staging": None,
            "executable": rlimits_python(),
            "sys_path": None,
            "extra_path": list(dict.fromkeys(extra)),
        }
    root = root_for(packages, workdir_mb)
    env = {"PATH": SAFE_PATH, "HOME": sandbox_root.WORK, "TMPDIR": sandbox_root.WORK}
    env.update(LANG="C.UTF-8", LD_LIBRARY_PATH=root.library_path)
    return {
        "level": level,
        "packages": list(packages),
        "mounts": [asdict(m) for m in root.mounts],
        "staging": sandbox_root.staging_dir(root) if level == "pivot_root" else None,
        "executable": root.python,
        "sys_path": list(root.sys_path),
        "extra_path": [],
        "work": sandbox_root.WORK,
        "env": env,
    }


def host_work(uids: tuple[int, int] | None) -> dict:
    """At level ``rlimits``: a fresh host folder as the work directory (the caller removes it)."""
    work = tempfile.mkdtemp(prefix=f"reward_fns-{os.getpid()}-")
    if uids:
        os.chown(work, uids[0], uids[0])
    env = {"PATH": SAFE_PATH, "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8"}
    return {"work": work, "env": env}


def _package_dir(name: str) -> str:
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise ValueError(f"allowed package {name!r} is not installed here")
    return os.path.dirname(spec.origin) if spec.submodule_search_locations else spec.origin


def root_for(packages: tuple[str, ...], workdir_mb: int) -> sandbox_root.Root:
    """The minimal root for a configuration (cached in ``sandbox_root``)."""
    return sandbox_root.minimal_root(packages, workdir_mb << 20, HERE)


def _world_readable(folder: str) -> bool:
    """Whether any uid can list ``folder`` and reach it (o+x on every folder on the way)."""
    parts = os.path.realpath(folder).split(os.sep)
    reachable = all(
        os.stat(os.sep.join(parts[:i]) or os.sep).st_mode & 0o001 for i in range(2, len(parts))
    )
    return reachable and os.stat(folder).st_mode & 0o005 == 0o005


@lru_cache(maxsize=1)
def rlimits_python() -> str:
    """The interpreter at level ``rlimits``. As root the program runs under a throwaway uid,
    which must read the stdlib: ours if it can, else the system python3 (3.10+), else none."""
    ours = os.path.realpath(sys.executable)
    if os.geteuid() != 0 or _world_readable(sandbox_root._interpreter_files()[2]):
        return ours
    system = shutil.which("python3", path=SAFE_PATH)
    if system:
        code = "import os, sys; print(os.path.dirname(os.__file__)); print(sys.version_info >= (3, 10))"
        out = subprocess.run(
            [system, "-I", "-S", "-c", code],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout.split()
        if out[-1:] == ["True"] and _world_readable(out[0]):
            return os.path.realpath(system)
    raise IsolationError(
        f"level 'rlimits' as root needs a stdlib other uids can read; {ours}'s is not, and "
        "there is no system python3 (3.10+) whose is"
    )


def command(level: str, packages: tuple[str, ...], workdir_mb: int, spec_fd: int) -> list[str]:
    """The command line that starts a run's first process (``_sandbox_init``) at ``level``."""
    if level not in BWRAP_LEVELS:  # _sandbox_init makes the namespaces itself at pivot_root
        init = os.path.join(HERE, "_sandbox_init.py")
        python = rlimits_python() if level == "rlimits" else os.path.realpath(sys.executable)
        return [python, "-I", "-S", init, str(spec_fd)]
    root = root_for(packages, workdir_mb)
    boot = [root.python, "-I", "-S", f"{sandbox_root.RUNTIME_DIR}/_sandbox_init.py", str(spec_fd)]
    env = ["--setenv", "LD_LIBRARY_PATH", root.library_path]
    flags = BWRAP if level == "bwrap" else BWRAP_USER
    return ["bwrap", *sandbox_root.bwrap_args(root), *flags, *env, *boot]


def wait(proc: subprocess.Popen[bytes], timeout: float) -> bool:
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


def _processes_of(uids: set[int]) -> list[int]:
    """Live (non-zombie) processes whose real uid is in ``uids``."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/status") as f:
                status = f.read()
        except (OSError, ValueError):
            continue
        match = re.search(r"^Uid:\s+(\d+)", status, re.MULTILINE)
        zombie = re.search(r"^State:\s+Z", status, re.MULTILINE)
        if entry.isdigit() and match and int(match.group(1)) in uids and not zombie:
            pids.append(int(entry))
    return pids


def reap(proc, cgroup, uids, level: str) -> None:
    """Kill everything the run started, so that nothing outlives it, not even a zombie.

    With a cgroup: every task in it, until it is empty. Without: the throwaway uids' processes
    (killing the launcher first would orphan them to the host's init), then the process group.
    At ``bwrap-user`` without a cgroup: bubblewrap's child first (see :func:`_stop_namespace`).
    """
    if level == "bwrap-user" and cgroup is None:
        _stop_namespace(proc)
    if cgroup is not None:
        if not cgroup.kill_all():
            logger.warning("code_tests sandbox: tasks %s outlived their run", cgroup.tasks())
    deadline = time.monotonic() + 5.0
    while True:
        stray = _processes_of(set(uids)) if uids and cgroup is None else []
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
        if not uids or cgroup is not None or late:
            proc.wait()
            if stray:
                logger.warning("code_tests sandbox: processes %s outlived their run", stray)
            return
        if proc.poll() is not None and not stray:
            return
        time.sleep(0.005)


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _stop_namespace(proc: subprocess.Popen[bytes]) -> None:
    """Level ``bwrap-user`` still running: SIGKILL bubblewrap's child, PID 1 of the run's PID
    namespace. The kernel kills the whole namespace (the program's nested one too) before that
    exit reaches bubblewrap, which then exits itself: once ``proc.wait`` returns, nothing of the
    run is left. Killing bubblewrap first would orphan a still dying namespace to the host."""
    if proc.poll() is not None:
        return
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or _parent_of(int(entry)) != proc.pid:
            continue
        try:
            pidfd = os.pidfd_open(int(entry))
        except OSError:
            continue
        try:
            if _parent_of(int(entry)) == proc.pid:  # still ours, now that the pidfd pins it
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        finally:
            os.close(pidfd)
    try:
        proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        pass  # reap()'s process-group kill follows
