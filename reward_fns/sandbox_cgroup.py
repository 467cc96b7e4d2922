"""Whole-run limits: one fresh cgroup per run holds memory and task count for everything it starts.

``RLIMIT_AS`` and ``RLIMIT_NPROC`` are per process (and per uid): six processes of 600 MB each
pass a 1 GB ``RLIMIT_AS``. A cgroup counts them together, and also counts the pages the program
writes to its tmpfs work directory. The run's first process joins the cgroup before it ``exec``s
the sandbox (``/bin/sh -c 'echo $$ > .../cgroup.procs && exec ...'``), so nothing escapes the
window between ``fork`` and the move; subprocess's ``preexec_fn`` would do the same but is unsafe
in the thread pool that ``code_tests`` runs.

cgroup v1 needs the ``memory`` and ``pids`` controllers (this machine: yes, under our own memory
cgroup). cgroup v2 needs both enabled in our cgroup's ``cgroup.subtree_control``; that path is
written from the kernel documentation and has not run on a v2 machine yet. Without either,
``reward_fns.sandbox`` falls back to per-process rlimits and says so.
"""

from __future__ import annotations

import errno
import glob
import logging
import os
import secrets
import shlex
import signal
import time
from dataclasses import dataclass
from functools import lru_cache

logger = logging.getLogger("reward_fns.code")

PREFIX = "reward_fns-"


@dataclass(frozen=True)
class Hierarchy:
    """Where run cgroups are made: v1 one folder per controller (memory, pids); v2 one folder."""

    version: int
    dirs: tuple[str, ...]

    def describe(self) -> str:
        return f"cgroup v{self.version} (memory + pids for the whole run)"


def _cgroup_mounts(mountinfo: str) -> list[tuple[str, str, str, set[str]]]:
    """(root, mount point, fstype, super options) of every cgroup mount in ``mountinfo``."""
    found = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            found.append((fields[3], fields[4], tail[0], set(tail[2].split(","))))
    return found


def _under(root: str, point: str, path: str) -> str | None:
    if root != "/" and not (path == root or path.startswith(root + "/")):
        return None
    rel = path[len(root) :] if root != "/" else path
    return point + rel.rstrip("/") if rel != "/" else point


def find_hierarchy(self_cgroup: str, mountinfo: str) -> Hierarchy | None:
    """The v1 (memory + pids) or v2 folders of our own cgroups, from the two /proc files' text."""
    paths = {}
    for line in self_cgroup.splitlines():
        number, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if number != "0" else ["unified"]:
            paths[controller] = path
    mounts = _cgroup_mounts(mountinfo)
    v1 = {}
    for controller in ("memory", "pids"):
        for root, point, fstype, options in mounts:
            if fstype == "cgroup" and controller in options and controller in paths:
                v1[controller] = _under(root, point, paths[controller])
    if all(v1.get(c) for c in ("memory", "pids")):
        return Hierarchy(1, (v1["memory"], v1["pids"]))
    for root, point, fstype, _ in mounts:
        if fstype == "cgroup2" and "unified" in paths:
            folder = _under(root, point, paths["unified"])
            try:
                with open(os.path.join(folder or "", "cgroup.subtree_control")) as f:
                    enabled = set(f.read().split())
            except OSError:
                continue
            if {"memory", "pids"} <= enabled:
                return Hierarchy(2, (folder,))
    return None


@lru_cache(maxsize=1)
def hierarchy() -> Hierarchy | None:
    """Our usable hierarchy, checked once by making and removing a probe cgroup."""
    try:
        with open("/proc/self/cgroup") as f, open("/proc/self/mountinfo") as g:
            found = find_hierarchy(f.read(), g.read())
    except OSError:
        return None
    if found is None:
        return None
    _remove_stale(found)
    try:
        RunCgroup(found, 64 << 20, 8).remove()
    except OSError as exc:
        logger.info("code_tests sandbox: cannot make cgroups under %s: %s", found.dirs, exc)
        return None
    return found


def _remove_stale(found: Hierarchy) -> None:
    """Empty run cgroups that a killed trainer left behind (their creator's pid is gone)."""
    for folder in found.dirs:
        for path in glob.glob(os.path.join(folder, PREFIX + "*")):
            pid = os.path.basename(path)[len(PREFIX) :].split("-")[0]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                try:
                    os.rmdir(path)
                except OSError:
                    pass


class RunCgroup:
    """One run's cgroup: made with its limits, joined by the run's first process, then removed."""

    def __init__(self, found: Hierarchy, memory_bytes: int, max_tasks: int) -> None:
        self.version = found.version
        name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
        self.paths = [os.path.join(folder, name) for folder in found.dirs]
        try:
            for path in self.paths:
                os.mkdir(path)
            if self.version == 1:
                memory, pids = self.paths
                self._write(memory, "memory.limit_in_bytes", memory_bytes)
                self._write(memory, "memory.memsw.limit_in_bytes", memory_bytes, optional=True)
                self._write(pids, "pids.max", max_tasks)
            else:
                (path,) = self.paths
                self._write(path, "memory.max", memory_bytes)
                self._write(path, "memory.swap.max", 0, optional=True)
                self._write(path, "pids.max", max_tasks)
        except OSError:
            self.remove()
            raise

    @staticmethod
    def _write(folder: str, name: str, value: int, optional: bool = False) -> None:
        try:
            with open(os.path.join(folder, name), "w") as f:
                f.write(str(value))
        except OSError:
            if not optional:
                raise

    def procs_files(self) -> list[str]:
        return [os.path.join(path, "cgroup.procs") for path in self.paths]

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` started by a shell that first moves itself into this cgroup."""
        joins = " && ".join(f"echo $$ > {shlex.quote(p)}" for p in self.procs_files())
        return ["/bin/sh", "-c", f'{{ {joins}; }} 2>/dev/null || exit 125; exec "$@"', "sh", *argv]

    def tasks(self) -> set[int]:
        found: set[int] = set()
        for path in self.paths:
            try:
                with open(os.path.join(path, "cgroup.procs")) as f:
                    found.update(int(pid) for pid in f.read().split())
            except OSError:
                pass
        return found

    def kill_all(self, timeout_s: float = 5.0) -> bool:
        """SIGKILL everything in the cgroup until it is empty (a fork bomb is capped by pids.max)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pids = self.tasks()
            if not pids:
                return True
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.002)
        return not self.tasks()

    def oom_kills(self) -> int:
        """How many processes the kernel killed for going over the run's memory."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            with open(os.path.join(self.paths[0], name)) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except OSError:
            pass
        return 0

    def remove(self, timeout_s: float = 2.0) -> None:
        """rmdir each folder; a task that is still exiting makes it EBUSY for a moment."""
        deadline = time.monotonic() + timeout_s
        for path in self.paths:
            while True:
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        logger.warning("code_tests sandbox: cannot remove %s: %s", path, exc)
                        break
                    time.sleep(0.005)
