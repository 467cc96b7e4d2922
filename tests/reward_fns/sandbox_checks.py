"""What a sandboxed run must not leave behind, seen from this test process.

Other people's runs on a shared machine also use throwaway uids, so a process counts as ours
only when it is in one of our run cgroups or below us in the process tree.
"""

from __future__ import annotations

import glob
import os

from reward_fns import sandbox, sandbox_cgroup


def _status(pid: str) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/status") as f:
            return dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)
    except OSError:
        return {}


def _descends_from(pid: str, ancestor: int) -> bool:
    for _ in range(64):
        ppid = _status(pid).get("PPid", "0").strip()
        if ppid in ("0", "1", pid):
            return False
        if int(ppid) == ancestor:
            return True
        pid = ppid
    return False


def _in_our_cgroup(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return f"{sandbox_cgroup.PREFIX}{os.getpid()}-" in f.read()
    except OSError:
        return False


def sandbox_processes() -> list[int]:
    """Our live (non-zombie) processes under a throwaway sandbox uid."""
    found = []
    for entry in os.listdir("/proc"):
        status = _status(entry) if entry.isdigit() else {}
        try:
            uid = int(status.get("Uid", "").split()[0])
        except (IndexError, ValueError):
            continue
        alive = not status.get("State", "").startswith("Z")
        ours = _in_our_cgroup(entry) or _descends_from(entry, os.getpid())
        if uid >= sandbox.UID_BASE and alive and ours:
            found.append(int(entry))
    return found


def children_of(pid: int) -> set[int]:
    kids = set()
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            kids.add(int(entry))
    return kids


def run_cgroups() -> list[str]:
    """Run cgroups this process made and did not remove."""
    found = sandbox_cgroup.hierarchy()
    pattern = f"{sandbox_cgroup.PREFIX}{os.getpid()}-*"
    return sorted(
        p for d in (found.dirs if found else ()) for p in glob.glob(os.path.join(d, pattern))
    )


def snapshot() -> dict[str, object]:
    """Everything a run could leave behind; equal before and after a test."""
    with open("/proc/self/mountinfo") as f:
        mounts = f.read()
    return {
        "processes": sandbox_processes(),
        "children": children_of(os.getpid()),
        "cgroups": run_cgroups(),
        "mounts": mounts,
        "host_tmp": sorted(
            e for e in os.listdir("/tmp") if e.startswith(f"reward_fns-{os.getpid()}-")
        ),
    }
