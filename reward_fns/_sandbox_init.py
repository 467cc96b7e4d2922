"""The sandbox's first process: builds the minimal root, drops privileges, runs the program.

Started by ``reward_fns.sandbox`` as ``python -I -S _sandbox_init.py SPEC_FD``, where ``SPEC_FD``
holds the spec (``marshal``: written by the host, and a builtin, where ``json`` would cost ~11 ms
of imports; every millisecond here is paid by every run). It is the one trusted process inside the sandbox and uses only the standard
library: ``-I`` keeps this folder off ``sys.path`` (``reward_fns/code.py`` and ``math.py`` would
shadow the stdlib), so :mod:`reward_fns._code_wire` and :mod:`reward_fns._code_harness` are loaded
by their file paths, before the host filesystem disappears.

Unlike the usual sandbox, which ``exec``s a fresh interpreter for the untrusted code, the
program's processes are ``fork``s of this one: an interpreter start-up is the largest cost of a
run (~15 ms), and the fork pays for the new mount work. What the fork inherits is public (this
module, the spec without the tests); the tests reach only the judge, through a descriptor that the
program's child closes before anything else.

Levels (chosen on the host): ``pivot_root`` - we make new mount, PID, network, IPC and UTS
namespaces with ``unshare(2)`` (what util-linux ``unshare --fork --kill-child`` does, minus an
exec), build the root from the spec's mount list as PID 1, and ``pivot_root`` into it; ``bwrap``
- bubblewrap built the root and we start inside it with only CAP_SETUID, CAP_SETGID and
CAP_CHOWN; ``bwrap-user`` - an unprivileged bubblewrap (its own user namespace, no capability)
built the same root, and with one uid for everyone the program is kept from the judge by
namespaces instead (:func:`own_namespaces`); ``rlimits`` - no root at all, the host filesystem
stays visible. At ``pivot_root`` and ``bwrap`` every forked child also gets a seccomp filter
against user namespaces of its own (:func:`forbid_user_namespaces`). Except under bubblewrap (whose caller does it), our first act is to join the
run's cgroup.
"""

from __future__ import annotations

import ctypes
import marshal
import os
import resource
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x4000000, 0x8000000
CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWUSER = 0x20000000, 0x40000000, 0x10000000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
_CAPABILITY_VERSION_3 = 0x20080522
SIGKILL = 9
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    def raw(text: str | None) -> bytes | None:
        return text.encode() if text else None

    _check(_libc.mount(raw(source), raw(target), raw(fstype), flags, raw(data)), f"mount {target}")


def _make_target(path: str, is_dir: bool) -> None:
    os.makedirs(path if is_dir else os.path.dirname(path), mode=0o755, exist_ok=True)
    if not is_dir and not os.path.exists(path):
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o444))


def _bind(source: str, target: str, flags: int) -> None:
    """A non-recursive bind, then a remount: a bind ignores flags until it is remounted."""
    _make_target(target, os.path.isdir(source))
    mount(source, target, None, MS_BIND)
    mount(None, target, None, MS_REMOUNT | MS_BIND | flags)


def build_root(staging: str, mounts: list[dict], work_uid: int | None) -> None:
    """Lay ``mounts`` out under ``staging`` (a fresh tmpfs), then make it ``/``.

    The kinds mirror bubblewrap's options (``reward_fns.sandbox_root`` writes both), so the two
    levels build the same tree.
    """
    mount("tmpfs", staging, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
    for m in mounts:
        target = staging + m["target"]
        kind = m["kind"]
        if kind == "ro":
            _bind(m["source"], target, MS_RDONLY | MS_NOSUID | MS_NODEV)
        elif kind == "dev":  # a device node: nodev would make it unusable
            _bind(m["source"], target, MS_NOSUID | MS_NOEXEC)
        elif kind == "mask":  # an empty read-only directory over a bound one (site-packages)
            mount("tmpfs", target, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=0755")
        elif kind == "work":
            owner = f",uid={work_uid},gid={work_uid}" if work_uid is not None else ""
            options = f"size={m['size']},nr_inodes=16384,mode=0700{owner}"
            _make_target(target, True)
            mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, options)
        elif kind == "proc":  # hidepid=2: the program cannot even see other uids' processes
            _make_target(target, True)
            mount("proc", target, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
        else:
            raise ValueError(f"unknown mount kind {kind!r}")
    os.chdir(staging)
    number = _PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(f"pivot_root: unknown syscall number on {os.uname().machine}")
    _check(_libc.syscall(number, b".", b"."), "pivot_root")  # the old root now sits on top of /
    _check(_libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")
    mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def enter_namespaces() -> None:
    """New namespaces; we go on as PID 1 inside, our parent stays outside to relay the exit.

    If the outside process is killed, PID 1 gets SIGKILL (``PR_SET_PDEATHSIG``), and with it
    every process of the namespace. Mounts made afterwards never propagate to the host.
    """
    flags = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID | CLONE_NEWNET
    _check(_libc.unshare(flags), "unshare")
    pid = os.fork()
    if pid:
        _close_fds_except(set())
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        os._exit(code if code >= 0 else 128 - code)
    _libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
    mount(None, "/", None, MS_REC | MS_PRIVATE)


def own_namespaces() -> None:
    """Level ``bwrap-user``: new user, mount and PID namespaces for the program's fork to come.

    Everyone here has the trainer's uid, so uids cannot keep the program from the judge, whose
    process, descriptors and memory a same-uid process could otherwise read (``/proc/PID/mem``,
    ``ptrace``, ``/proc/PID/fd``) or signal. The next fork is PID 1 of a PID namespace the judge
    is not in (:func:`program_init`), with a ``/proc`` of its own: the judge, this supervisor and
    the host's processes have no PID there. Unprivileged: the user namespace maps our one uid.
    """
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID), "unshare")
    maps = (("uid_map", f"{uid} {uid} 1"), ("setgroups", "deny"), ("gid_map", f"{gid} {gid} 1"))
    for name, text in maps:
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


# machine: (its AUDIT_ARCH, and the numbers of unshare, clone, clone3 and setns); little-endian
# machines whose clone takes its flags first, so a filter reads both calls' flags in one place
_SECCOMP_SYSCALLS = {
    "x86_64": (0xC000003E, 272, 56, 435, 308),
    "aarch64": (0xC00000B7, 97, 220, 435, 268),
    "riscv64": (0xC00000F3, 97, 220, 435, 268),
}
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
_RET_ALLOW, _RET_ERRNO, _EPERM, _ENOSYS = 0x7FFF0000, 0x00050000, 1, 38
_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06  # classic BPF opcodes


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte)]
    _fields_ += [("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def forbid_user_namespaces() -> None:
    """Levels ``pivot_root`` and ``bwrap``: no user namespace of the program's own, for good.

    Root made the run's namespaces, so the program (a throwaway uid) stands in the host's user
    namespace, where unprivileged users may create one: inside it every capability is theirs,
    over namespaces they make next (an nf_tables netlink socket in a new network namespace: the
    entry point of known kernel exploits). Level ``bwrap-user`` sets ``max_user_namespaces`` to
    0 in its own user namespace (:func:`program_init`); here that sysctl is the host's, so a
    seccomp filter refuses instead: ``unshare(2)`` and ``clone(2)`` with ``CLONE_NEWUSER`` and
    ``setns(2)`` fail with EPERM, ``clone3(2)`` with ENOSYS (its flags are in memory a filter
    cannot read; the C library then falls back to ``clone``), and so does every system call of
    another ABI (x32, 32-bit), which the filter's numbers do not cover. Inherited by every child
    and never lifted; needs ``no_new_privs`` (:func:`_become` sets it first)."""
    machine = os.uname().machine
    if machine not in _SECCOMP_SYSCALLS:
        raise OSError(f"no seccomp filter against user namespaces for {machine}")
    audit, unshare, clone, clone3, setns = _SECCOMP_SYSCALLS[machine]
    flags, deny, nosys = 9, 12, 13  # the indices of the instructions jumped to
    program = [  # (code, jump if true, jump if false, k); a jump skips that many instructions
        (_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        (_JEQ, 0, deny - 2, audit),
        (_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
        (_JGE, deny - 4, 0, 0x40000000),  # x32 system calls (the x32 bit)
        (_JEQ, flags - 5, 0, unshare),
        (_JEQ, flags - 6, 0, clone),
        (_JEQ, nosys - 7, 0, clone3),
        (_JEQ, deny - 8, 0, setns),
        (_RET, 0, 0, _RET_ALLOW),
        (_LD_W_ABS, 0, 0, 16),  # flags: the low word of seccomp_data.args[0]
        (_JSET, deny - 11, 0, CLONE_NEWUSER),
        (_RET, 0, 0, _RET_ALLOW),
        (_RET, 0, 0, _RET_ERRNO | _EPERM),
        (_RET, 0, 0, _RET_ERRNO | _ENOSYS),
    ]
    code = (_SockFilter * len(program))(*(_SockFilter(*op) for op in program))
    fprog = _SockFprog(len(program), code)
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


def drop_capabilities() -> None:
    """No capability left, in any set, and none to come back (bounding and ambient sets)."""
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "drop bounding capability")
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)  # this process
    _check(_libc.capset(header, (ctypes.c_uint32 * 6)()), "capset")


def program_init(spec: dict, keep_fds: set[int], body) -> None:
    """PID 1 of the program's PID namespace (level ``bwrap-user``): mounts that namespace's
    ``/proc``, forbids further user namespaces, drops every capability, makes itself
    undumpable and a session leader (the program cannot signal its parent's process group),
    then runs the program as PID 2 and exits with its status. PID 1 ignores the signals the
    program may send it, and when it exits the kernel kills all that is left in the namespace.
    """
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    with open("/proc/sys/user/max_user_namespaces", "w") as f:
        f.write("0")
    drop_capabilities()
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    os.setsid()
    child = _fork(spec, None, keep_fds, body)
    _close_fds_except(set())
    code = _wait_for(child)
    os._exit(code if code >= 0 else 128 - code)


def join_cgroups(procs_files: list[str]) -> None:
    """Move this process (and so everything it will start) into the run's cgroup."""
    for path in procs_files:
        with open(path, "w") as f:
            f.write(str(os.getpid()))


def _close_fds_except(keep: set[int]) -> None:
    """Close every descriptor but 0, 1, 2 and ``keep``."""
    previous = 2
    for fd in sorted(keep | {2**16}):
        if fd > previous + 1:
            os.closerange(previous + 1, fd)
        previous = fd


def _become(uid: int | None) -> None:
    """Switch to ``uid`` for good (no groups, no capabilities left), and never regain any."""
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def drop_privileges(spec: dict, uid: int | None, keep_fds: set[int]) -> None:
    """Everything a run's process gives up before untrusted code or data reaches it."""
    _close_fds_except(keep_fds)
    for name, value in spec["limits"].items():
        resource.setrlimit(getattr(resource, name), tuple(value))
    _become(uid)
    if spec["level"] in ("pivot_root", "bwrap"):  # bwrap-user: program_init forbids them
        forbid_user_namespaces()


def _fork(spec: dict, uid: int | None, keep_fds: set[int], body) -> int:
    """Fork a child that drops privileges, runs ``body()`` (which must not return), and exits."""
    pid = os.fork()
    if pid:
        return pid
    status = 70
    try:
        drop_privileges(spec, uid, keep_fds)
        body()
    except BaseException as exc:  # noqa: BLE001 - a child must never return into this code
        os.write(2, f"_sandbox_init: {exc!r}\n".encode())
    os._exit(status)


def _wait_for(child: int) -> int:
    """Reap until ``child`` exits (as PID 1 we also inherit the program's orphans)."""
    while True:
        pid, status = os.wait()
        if pid == child:
            return os.waitstatus_to_exitcode(status)


def _load(directory: str, name: str):
    """Import ``directory/name.py`` as top-level ``name`` (its ``.pyc`` is used when current)."""
    from importlib.machinery import SourceFileLoader  # importlib.util costs ~10 ms more

    loader = SourceFileLoader(name, os.path.join(directory, f"{name}.py"))
    module = type(sys)(name)
    module.__file__, module.__loader__ = loader.path, loader
    sys.modules[name] = module
    loader.exec_module(module)
    return module


def _move_imports(old_stdlib: str, new_stdlib: str) -> None:
    """Point the packages imported before ``pivot_root`` (``encodings``, ``json``, ``ctypes``...)
    at the stdlib's place inside the root, or their submodules (``encodings.idna``) would be
    searched for on the host's path, which is gone."""
    for module in list(sys.modules.values()):
        path = getattr(module, "__path__", None)
        if isinstance(path, list):
            module.__path__ = [
                new_stdlib + p[len(old_stdlib) :] if p.startswith(old_stdlib) else p for p in path
            ]


def _enter(spec: dict) -> None:
    """Reach the run's root (or, at level ``rlimits``, its working directory)."""
    uid_c = spec["uids"][0] if spec["uids"] else None
    if spec["level"] == "pivot_root":
        old_stdlib = os.path.dirname(os.__file__)
        build_root(spec["staging"], spec["mounts"], uid_c)
        _move_imports(old_stdlib, spec["sys_path"][0])
    elif spec["level"] == "bwrap" and uid_c is not None:
        os.chown(spec["work"], uid_c, uid_c)
    if spec["sys_path"] is not None:
        sys.path[:] = spec["sys_path"]
    sys.path += spec["extra_path"]
    sys.executable = spec["executable"]
    sys.argv = ["solution.py"]
    os.environ.clear()
    os.environ.update(spec["env"])


def main(spec_fd: int) -> int:
    with os.fdopen(spec_fd, "rb") as f:
        spec = marshal.loads(f.read())
    os.umask(0o022)  # the trainer's umask must not make the root unreadable to the program
    join_cgroups(spec["cgroup_procs"])
    if spec["level"] == "pivot_root":
        enter_namespaces()
    here = os.path.dirname(os.path.abspath(__file__))
    _load(here, "_code_wire")
    harness = _load(here, "_code_harness")
    _enter(spec)
    uid_c, uid_j = spec["uids"] or (None, None)
    work = spec["work"]

    def candidate(*fds: int):
        def body():
            os.chdir(work)
            harness.run_candidate(spec["code"], *fds)

        return body

    def start_program(keep_fds: set[int], body) -> int:
        if spec["level"] != "bwrap-user":
            return _fork(spec, uid_c, keep_fds, body)
        own_namespaces()
        pid = _fork(spec, None, keep_fds, lambda: program_init(spec, keep_fds, body))
        drop_capabilities()  # those of the new user namespace: the supervisor needs none
        _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        return pid

    if spec["tests_fd"] is None:  # stdin/stdout case: the host compares the output
        child = start_program(set(), candidate())
        _become(uid_j)
        return _wait_for(child)
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    judged = {req_w, resp_r, spec["tests_fd"], spec["results_fd"]}

    def judge():
        # Not dumpable: no ptrace and no /proc/PID/{mem,fd} for anyone without privilege.
        _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        harness.run_judge(spec["tests_fd"], spec["results_fd"], req_w, resp_r, spec["packages"])

    child = _fork(spec, uid_j, judged, judge)  # first: at bwrap-user it stays outside
    for fd in judged:
        os.close(fd)
    start_program({req_r, resp_w}, candidate(req_r, resp_w))
    os.close(req_r)
    os.close(resp_w)
    _become(uid_j)  # the supervisor only waits from here: it keeps no privilege
    return _wait_for(child)  # then PID 1 exits and the kernel kills the rest of the namespace


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
