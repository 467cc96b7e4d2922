"""How each isolation level starts a run: its command line and the fixed part of its spec.

``bwrap`` runs ``bwrap`` with the root of :mod:`reward_fns.sandbox_root` and starts
``_sandbox_init`` inside it; ``pivot_root`` and ``rlimits`` start ``_sandbox_init`` directly (at
``pivot_root`` it makes the namespaces and the root itself). At ``rlimits`` as root the program
runs under a throwaway uid that must read the standard library; pyenv puts it under ``/root``
(mode 700), so this level then uses the system ``python3``, as the previous sandbox did.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict
from functools import lru_cache

from reward_fns import sandbox_root

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
HERE = os.path.dirname(os.path.abspath(__file__))
BWRAP = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--die-with-parent"]
BWRAP += ["--as-pid-1", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
BWRAP += ["--cap-add", "CAP_CHOWN", "--chdir", "/"]


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
    if level != "bwrap":  # _sandbox_init makes the namespaces itself at level pivot_root
        init = os.path.join(HERE, "_sandbox_init.py")
        python = rlimits_python() if level == "rlimits" else os.path.realpath(sys.executable)
        return [python, "-I", "-S", init, str(spec_fd)]
    root = root_for(packages, workdir_mb)
    boot = [root.python, "-I", "-S", f"{sandbox_root.RUNTIME_DIR}/_sandbox_init.py", str(spec_fd)]
    env = ["--setenv", "LD_LIBRARY_PATH", root.library_path]
    return ["bwrap", *sandbox_root.bwrap_args(root), *BWRAP, *env, *boot]
