"""The minimal root that sandboxed code sees: one mount list, built by bubblewrap or by us.

The tree, whatever the host's layout::

    /usr/local/bin/python3.X              the interpreter          } read-only, remapped from the
    /usr/local/lib/libpython3.X.so.1.0    (when it is shared)      } host's prefix (here pyenv under
    /usr/local/lib/python3.X              the standard library     } /root), so no home shows
    /usr/local/lib/python3.X/site-packages   an empty read-only tmpfs over the host's
    /usr/local/lib/sandbox-packages/NAME  allow-listed packages only (none by default)
    /usr/local/lib/sandbox-runtime/       _sandbox_init.py, _code_wire.py, _code_harness.py
    /lib/..., /lib64/...                  each shared library the interpreter and its extension
                                          modules load (``ldd``), bound file by file
    /dev/null, /dev/urandom, /proc (new PID namespace), /work (tmpfs, size cap)

No ``/etc``: Python needs none of it (``pwd``, ``socket.getaddrinfo`` and the like fail). No
``/tmp``: ``TMPDIR`` points at ``/work``, the one writable place.
Usually one binds ``/usr``, ``/lib`` and ``/etc`` whole; that shows every installed package and
``/etc/passwd``. Here the library list is computed once per process with ``ldd``.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from functools import lru_cache

PREFIX = "/usr/local"
WORK = "/work"
PACKAGES_DIR = f"{PREFIX}/lib/sandbox-packages"
RUNTIME_DIR = f"{PREFIX}/lib/sandbox-runtime"
RUNTIME_FILES = ("_sandbox_init.py", "_code_wire.py", "_code_harness.py")
TOP_LEVEL = frozenset({"dev", "lib", "lib64", "proc", "usr", "work"})  # what `ls /` shows
_SKIP_EXTENSIONS = ("_tkinter",)  # Tk and X11 libraries, useless without a display


@dataclass(frozen=True)
class Mount:
    """One entry of the root: ``kind`` is ro, dev, mask, work or proc."""

    kind: str
    target: str
    source: str = ""
    size: int = 0


@dataclass(frozen=True)
class Root:
    """The mounts, and where the interpreter and its import path are inside the root."""

    mounts: tuple[Mount, ...]
    python: str
    sys_path: tuple[str, ...]
    library_path: str
    host_sources: tuple[str, ...]


def _interpreter_files() -> tuple[str, str, str]:
    """Host paths: the real interpreter binary, its prefix, and the standard library folder."""
    return (
        os.path.realpath(sys.executable),
        os.path.realpath(sys.base_prefix),
        os.path.realpath(sysconfig.get_path("stdlib")),  # the base one, also in a venv
    )


def _inside(host_path: str, prefix: str, stdlib: str) -> str:
    """Where a host file goes: the interpreter's own files move under PREFIX, the rest stay."""
    if host_path == stdlib or host_path.startswith(stdlib + os.sep):
        return f"{PREFIX}/lib/{os.path.basename(stdlib)}{host_path[len(stdlib) :]}"
    if os.path.dirname(host_path) in (f"{prefix}/bin", f"{prefix}/lib"):
        return (
            f"{PREFIX}/{os.path.basename(os.path.dirname(host_path))}/{os.path.basename(host_path)}"
        )
    return host_path


def _ldd(binaries: list[str]) -> set[str]:
    """The shared libraries (and the dynamic loader) that ``binaries`` load, by ``ldd``."""
    found = set()
    for start in range(0, len(binaries), 200):
        out = subprocess.run(
            ["ldd", *binaries[start : start + 200]],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        ).stdout
        for line in out.splitlines():
            path = line.split("=>")[-1].split("(")[0].strip()
            if path.startswith("/") and os.path.exists(path):
                found.add(path)
    return found


@lru_cache(maxsize=1)
def shared_libraries() -> tuple[str, ...]:
    """Every shared library the interpreter and its extension modules load."""
    python, _, stdlib = _interpreter_files()
    extensions = [
        path
        for path in glob.glob(os.path.join(stdlib, "lib-dynload", "*.so"))
        if not os.path.basename(path).startswith(_SKIP_EXTENSIONS)
    ]
    found = _ldd([python, *extensions])
    if not found:
        raise RuntimeError("ldd listed no shared libraries for the interpreter")
    return tuple(sorted(found))


def _package_libraries(sources: list[str]) -> set[str]:
    """System libraries that the allowed packages' extensions load (numpy: libstdc++...);
    the packages' own bundled ones (``numpy.libs``) are reached through their bind."""
    binaries = [
        os.path.join(top, name)
        for source in sources
        for top, _, files in os.walk(source)
        for name in files
        if ".so" in name
    ]
    inside = tuple(source + os.sep for source in sources)
    return {lib for lib in _ldd(binaries) if not lib.startswith(inside)} if binaries else set()


def _package_mounts(packages: tuple[str, ...]) -> list[Mount]:
    """Read-only binds of each allowed top-level package (and its ``NAME.libs`` wheel folder)."""
    mounts = []
    for name in packages:
        spec = importlib.util.find_spec(name) if name.isidentifier() else None
        if spec is None or not (spec.submodule_search_locations or spec.origin):
            raise ValueError(f"allowed package {name!r} is not installed here")
        location = (
            list(spec.submodule_search_locations)[0]
            if spec.submodule_search_locations
            else spec.origin
        )
        for path in (location, os.path.join(os.path.dirname(location), f"{name}.libs")):
            if os.path.exists(path):
                real = os.path.realpath(path)
                mounts.append(Mount("ro", f"{PACKAGES_DIR}/{os.path.basename(path)}", real))
    return mounts


def _runtime_mounts(runtime_dir: str) -> list[Mount]:
    """Our runtime files, and their current ``.pyc`` (the root is read-only: none can be made)."""
    mounts = []
    for name in RUNTIME_FILES:
        source = os.path.join(runtime_dir, name)
        mounts.append(Mount("ro", f"{RUNTIME_DIR}/{name}", source))
        cached = importlib.util.cache_from_source(source)
        if os.path.exists(cached):
            inner = f"{RUNTIME_DIR}/__pycache__/{os.path.basename(cached)}"
            mounts.append(Mount("ro", inner, cached))
    return mounts


@lru_cache(maxsize=16)
def minimal_root(packages: tuple[str, ...], work_bytes: int, runtime_dir: str) -> Root:
    """The root for one configuration (cached: ``ldd`` and the package look-up run once)."""
    python, prefix, stdlib = _interpreter_files()
    inner_stdlib = _inside(stdlib, prefix, stdlib)
    package_mounts = _package_mounts(packages)
    libraries = set(shared_libraries()) | _package_libraries([m.source for m in package_mounts])
    mounts = [Mount("ro", _inside(python, prefix, stdlib), python)]
    mounts += [Mount("ro", _inside(lib, prefix, stdlib), lib) for lib in sorted(libraries)]
    mounts.append(Mount("ro", inner_stdlib, stdlib))
    if os.path.isdir(os.path.join(stdlib, "site-packages")):
        mounts.append(Mount("mask", f"{inner_stdlib}/site-packages"))
    mounts += package_mounts
    mounts += _runtime_mounts(runtime_dir)
    mounts += [Mount("dev", "/dev/null", "/dev/null"), Mount("dev", "/dev/urandom", "/dev/urandom")]
    mounts += [Mount("proc", "/proc"), Mount("work", WORK, size=work_bytes)]
    sys_path = [inner_stdlib, f"{inner_stdlib}/lib-dynload"] + ([PACKAGES_DIR] if packages else [])
    return Root(
        mounts=tuple(mounts),
        python=_inside(python, prefix, stdlib),
        sys_path=tuple(sys_path),
        library_path=f"{PREFIX}/lib",
        host_sources=tuple(m.source for m in mounts if m.kind in ("ro", "dev")),
    )


def _parent_dirs(root: Root) -> list[str]:
    """Every folder above a mount point that the root itself must hold, shallowest first."""
    bound = [m.target for m in root.mounts if m.kind == "ro" and os.path.isdir(m.source)]
    found = set()
    for m in root.mounts:
        parent = os.path.dirname(m.target)
        while parent != "/" and not any(parent.startswith(b + "/") or parent == b for b in bound):
            found.add(parent)
            parent = os.path.dirname(parent)
    return sorted(found, key=lambda d: (d.count("/"), d))


def bwrap_args(root: Root) -> list[str]:
    """The same tree as bubblewrap options (its ``--remount-ro /`` ends it).

    bubblewrap makes missing parent folders 0700, which the program's uid could not enter, so
    each one is made first with ``--perms 0755 --dir``.
    """
    args: list[str] = []
    for folder in _parent_dirs(root):
        args += ["--perms", "0755", "--dir", folder]
    for m in root.mounts:
        if m.kind == "ro":
            args += ["--ro-bind", m.source, m.target]
        elif m.kind == "dev":
            args += ["--dev-bind", m.source, m.target]
        elif m.kind == "mask":
            args += ["--perms", "0755", "--tmpfs", m.target, "--remount-ro", m.target]
        elif m.kind == "work":
            args += ["--size", str(m.size), "--perms", "0700", "--tmpfs", m.target]
        elif m.kind == "proc":
            args += ["--proc", m.target]
    return args + ["--remount-ro", "/"]


def staging_dir(root: Root) -> str:
    """A host directory to build the root on (in a private mount namespace) that no bind source
    lies under, since the tmpfs mounted there hides what was below."""
    for candidate in ("/mnt", "/tmp", "/var/tmp", "/media"):
        inside = any(s == candidate or s.startswith(candidate + "/") for s in root.host_sources)
        if os.path.isdir(candidate) and not os.path.islink(candidate) and not inside:
            return candidate
    raise RuntimeError("no directory to build the sandbox root on")
