"""The sandbox's minimal root and whole-run limits (issue 12).

Each attack scores 0 at both root-building levels (bubblewrap, our own pivot_root) and leaves
nothing behind: no process, cgroup, mount or host /tmp entry. The file-reading attacks are also
run at level ``rlimits``, where they must succeed: that proves each attack program works, so
its 0 elsewhere comes from the root, not from a bug in the attack.
"""

from __future__ import annotations

import logging
import os
import uuid

import pytest
import sandbox_checks
from conftest import REPO_ROOT

import reward_fns
from reward_fns import code as code_mod
from reward_fns import sandbox, sandbox_cgroup, sandbox_root

CHECKOUT = str(REPO_ROOT)
ROOT_LEVELS = ["bwrap", "pivot_root"]


def fence(src: str) -> str:
    return f"```python\n{src}\n```"


def score(code: str, tests, isolation: str, **params) -> float | None:
    fn = reward_fns.get("code_tests", isolation=isolation, timeout_s=10.0, **params)
    return fn(prompts=["p"], completions=[fence(code)], tests=[tests])[0]


def require(level: str) -> str:
    why = sandbox._why_not(level)
    if why:
        pytest.skip(f"isolation {level!r} unavailable here: {why}")
    return level


@pytest.fixture(params=ROOT_LEVELS)
def level(request) -> str:
    return require(request.param)


@pytest.fixture(autouse=True)
def leaves_nothing():
    before = sandbox_checks.snapshot()
    yield
    assert sandbox_checks.snapshot() == before


@pytest.fixture
def hidden_tests_file():
    """A 'hidden tests' file planted on the host's /tmp, world-readable like a dataset cache."""
    path = f"/tmp/hidden-tests-{uuid.uuid4().hex}.json"
    with open(path, "w") as f:
        f.write('{"expected_output": "1234567"}')
    os.chmod(path, 0o644)
    yield path
    os.remove(path)


# Each program prints what it found outside the sandbox; the expected output is exactly that.
READS = {
    "hidden_tests_in_host_tmp": (
        "import glob, json\nfor p in glob.glob('/tmp/hidden-tests-*.json'):\n"
        "    print(json.load(open(p))['expected_output'])",
        "1234567\n",
    ),
    "project_checkout": (
        f"print(open({CHECKOUT + '/reward_fns/__init__.py'!r}).readline(), end='')",
        open(os.path.join(CHECKOUT, "reward_fns", "__init__.py")).readline(),
    ),
    "etc_passwd": ("print(open('/etc/passwd').readline(), end='')", open("/etc/passwd").readline()),
}


@pytest.mark.parametrize("isolation", [*ROOT_LEVELS, "rlimits"])
def test_files_outside_the_sandbox_cannot_be_read(isolation, hidden_tests_file):
    require(isolation)
    names = sorted(READS)
    fn = reward_fns.get("code_tests", isolation=isolation, timeout_s=10.0)
    tests = [[{"input": "", "output": READS[name][1]}] for name in names]
    scores = fn(["p"] * len(names), [fence(READS[name][0]) for name in names], tests=tests)
    expected = 1.0 if isolation == "rlimits" else 0.0  # without a root each attack works
    assert dict(zip(names, scores)) == dict.fromkeys(names, expected)


WALK = """
import os
for top, dirs, files in os.walk('/'):
    if top == '/proc':
        dirs[:] = []
        continue
    for name in dirs + files:
        print(os.path.join(top, name))
"""


def _allowed(path: str, stdlib: str) -> bool:
    runtime = sandbox_root.RUNTIME_DIR
    if path.startswith((stdlib + "/", runtime + "/", "/usr/local/lib/sandbox-packages")):
        return not path.startswith(stdlib + "/site-packages/")  # masked: must be empty
    parents = {"/usr", "/usr/local", "/usr/local/bin", "/usr/local/lib", "/lib", "/lib64"}
    if path in parents | {stdlib, runtime, "/dev", "/dev/null", "/dev/urandom", "/proc", "/work"}:
        return True
    name = os.path.basename(path)
    shared_library = path.startswith(("/lib/", "/lib64/", "/usr/local/lib/")) and ".so" in name
    return (
        shared_library
        or path == f"/usr/local/bin/{os.path.basename(stdlib)}"
        or (
            path.startswith("/lib/") and "/" not in path[len("/lib/") :]  # /lib/<multiarch dir>
        )
    )


def test_the_whole_tree_is_the_allow_list(level):
    result = sandbox.run_python(WALK, isolation=level)
    paths = result.stdout.split()
    stdlib = f"/usr/local/lib/python3.{os.sys.version_info.minor}"
    assert result.returncode == 0 and f"{stdlib}/os.py" in paths
    assert [p for p in paths if not _allowed(p, stdlib)] == []
    top = {p[1:] for p in paths if p.count("/") == 1}
    assert top <= sandbox_root.TOP_LEVEL and "etc" not in top and "tmp" not in top
    lister = (
        f"import os\nprint('found' if set(os.listdir('/')) - {set(sandbox_root.TOP_LEVEL)} else '')"
    )
    assert score(lister, [{"input": "", "output": "found"}], level) == 0.0


def test_stdlib_imports_work_in_the_root(level):
    """Packages imported before pivot_root (encodings, json, ctypes) still find submodules."""
    code = (
        "import encodings.idna, ctypes.util, json, email.mime.text, xml.etree.ElementTree\n"
        "import sqlite3, decimal, hashlib, tempfile, subprocess, sys\n"
        "print(subprocess.run([sys.executable, '-c', 'print(6*7)'], capture_output=True,"
        " text=True).stdout.strip(), tempfile.gettempdir())"
    )
    assert score(code, [{"input": "", "output": "42 /work"}], level) == 1.0


def test_allow_listed_packages_only(level):
    numpy = "import numpy\nprint(numpy.add(40, 2))"
    io = [{"input": "", "output": "42"}]
    assert score(numpy, io, level) == 0.0  # nothing beyond the stdlib by default
    assert score(numpy, io, level, packages=["numpy"]) == 1.0
    yaml = "import numpy, yaml\nprint(42)"
    assert score(yaml, io, level, packages=["numpy"]) == 0.0


SIX_PROCESSES = """
import os, select, sys
ready_r, ready_w = os.pipe()
hold_r, hold_w = os.pipe()
for _ in range(6):
    if os.fork() == 0:
        os.close(hold_w)
        data = b"x" * ({mb} << 20)
        os.write(ready_w, b"1")
        os.read(hold_r, 1)  # keep the memory until the parent lets go
        os._exit(0)
os.close(ready_w)
ready = 0
while ready < 6:
    if select.select([ready_r], [], [], 0.05)[0]:
        ready += len(os.read(ready_r, 6))
    if os.waitpid(-1, os.WNOHANG)[0]:
        sys.exit("a child died before all six held their memory")
os.close(hold_w)
print(sum(os.waitstatus_to_exitcode(os.wait()[1]) == 0 for _ in range(6)))
"""


@pytest.fixture
def cgroup():
    if sandbox_cgroup.hierarchy() is None:
        pytest.skip("no usable cgroup here: limits are per process only")


def test_memory_is_capped_for_the_whole_run(cgroup, monkeypatch):
    runs = []
    real_run = code_mod.run_python
    monkeypatch.setattr(code_mod, "run_python", lambda *a: runs.append(real_run(*a)) or runs[-1])
    io = [{"input": "", "output": "6"}]
    assert score(SIX_PROCESSES.format(mb=100), io, "auto", memory_mb=1024) == 1.0  # 600 MB: fits
    assert score(SIX_PROCESSES.format(mb=600), io, "auto", memory_mb=1024) == 0.0  # 3.6 GB
    assert [r.oom_kills > 0 for r in runs] == [False, True]  # the cgroup did it, not RLIMIT_AS


def test_processes_are_capped_for_the_whole_run(cgroup):
    code = (
        "import os, time\nn = 0\nfor _ in range(100):\n    try:\n        if os.fork() == 0:\n"
        "            time.sleep(5)\n            os._exit(0)\n        n += 1\n    except OSError:\n"
        "        break\nprint(n)"
    )
    result = sandbox.run_python(code, limits=sandbox.SandboxLimits(timeout_s=10.0))
    assert 0 < int(result.stdout) < sandbox.SandboxLimits().max_processes


def test_work_dir_is_a_capped_tmpfs(level):
    tag = uuid.uuid4().hex
    code = f"""
import errno
written = 0
for i in range(100):
    try:
        with open(f"/work/{tag}-{{i}}", "wb") as f:
            f.write(b"x" * (1 << 20))
        written += 1
    except OSError as exc:
        print("stopped", errno.errorcode[exc.errno])
        break
for path in ("/tmp/{tag}", "/dev/shm/{tag}", "/{tag}"):
    try:
        open(path, "w").write("x")
        print("escaped to", path)
    except OSError:
        pass
print("written", written)
"""
    assert score(code, [{"input": "", "output": "written 100"}], level, workdir_mb=64) == 0.0
    result = sandbox.run_python(code, isolation=level)
    lines = result.stdout.splitlines()
    assert lines[0] == "stopped ENOSPC" and int(lines[-1].split()[1]) <= 64
    assert not any("escaped" in line for line in lines)
    assert [e for e in os.listdir("/tmp") if tag in e] == []


# Each attempt runs in a forked child, so one's namespace does not change the next one's start.
NESTED_USER_NAMESPACE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER, CLONE_NEWNET, SIGCHLD = 0x10000000, 0x40000000, 17

def attempt(name, call):
    r, w = os.pipe()
    if os.fork() == 0:
        os.close(r)
        result = call()
        if result == 0:  # in a user namespace of its own: which capabilities are ours there?
            status = open('/proc/self/status').read().split('CapEff:')[1].split()[0]
            os.write(w, f'{{name}} 0 CapEff={{status}}'.encode())
        elif result > 0:  # clone's parent: the child (in its namespace) exits at once
            os.waitpid(result, 0)
            os.write(w, f'{{name}} 0'.encode())
        else:
            os.write(w, f'{{name}} -1 {{os.strerror(ctypes.get_errno())}}'.encode())
        os._exit(0)
    os.close(w)
    print(os.read(r, 200).decode())
    os.wait()

def clone_child():
    pid = libc.syscall({clone}, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)
    if pid == 0:
        os._exit(0)
    return pid

attempt('unshare', lambda: libc.unshare(CLONE_NEWUSER | CLONE_NEWNET))
attempt('clone', clone_child)
"""


@pytest.mark.parametrize("isolation", [*ROOT_LEVELS, "rlimits"])
def test_the_program_cannot_make_a_user_namespace_of_its_own(isolation):
    """issue 45: at pivot_root the program created a nested user namespace, where it held every
    capability (an nf_tables netlink socket in a network namespace of its own is the entry point
    of known kernel exploits); bwrap-user forbade it, now the root levels do too (a seccomp
    filter). At rlimits, as root, the same program gets one: the attack works."""
    require(isolation)
    clone = {"x86_64": 56, "aarch64": 220, "riscv64": 220}.get(os.uname().machine)
    if clone is None:
        pytest.skip(f"no clone(2) number for {os.uname().machine} here")
    if isolation == "rlimits" and os.geteuid() != 0:
        pytest.skip("the control needs the throwaway uid of a root trainer")
    result = sandbox.run_python(NESTED_USER_NAMESPACE.format(clone=clone), isolation=isolation)
    lines = result.stdout.splitlines()
    if isolation == "rlimits":  # the control
        assert lines[0].startswith("unshare 0 CapEff=")
        assert int(lines[0].split("=")[1], 16) != 0 and lines[1] == "clone 0", result
    else:
        assert lines == ["unshare -1 Operation not permitted", "clone -1 Operation not permitted"]


def test_threads_forks_and_subprocesses_still_work_under_the_filter(level):
    """clone3 answers ENOSYS there: the C library falls back to clone, which the filter allows
    without CLONE_NEWUSER."""
    code = (
        "import os, subprocess, sys, threading\n"
        "t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n"
        "if os.fork() == 0:\n    os._exit(7)\n"
        "print('fork', os.waitstatus_to_exitcode(os.wait()[1]))\n"
        "print(subprocess.run([sys.executable, '-c', 'print(6*7)'], capture_output=True,"
        " text=True).stdout.strip())"
    )
    assert sandbox.run_python(code, isolation=level).stdout.split() == ["thread", "fork", "7", "42"]


def test_open_files_are_capped(level):
    code = "fs = []\ntry:\n    while True:\n        fs.append(open('/dev/null'))\nexcept OSError:\n    print(len(fs))"
    result = sandbox.run_python(code, isolation=level)
    assert 0 < int(result.stdout) <= sandbox.SandboxLimits().max_open_files


def test_strict_refuses_without_a_minimal_root(monkeypatch):
    monkeypatch.setattr(sandbox, "_why_not", lambda lvl: "" if lvl == "rlimits" else "no root")
    sandbox._best_level.cache_clear()
    try:
        with pytest.raises(sandbox.IsolationError, match="apt-get install bubblewrap"):
            sandbox.isolation_level("strict")
        with pytest.raises(sandbox.IsolationError, match="strict"):
            reward_fns.get("code_tests", isolation="strict")(["p"], ["x"], tests=["assert 1"])
        assert sandbox.isolation_level("auto") == "rlimits"
    finally:
        sandbox._best_level.cache_clear()


@pytest.mark.parametrize("isolation", ["auto", "rlimits"])
def test_active_level_and_limits_are_logged(caplog, isolation):
    sandbox._announced.cache_clear()
    if isolation != "auto" and sandbox._why_not(isolation):
        pytest.skip(f"{isolation}: {sandbox._why_not(isolation)}")
    with caplog.at_level(logging.INFO, logger="reward_fns.code"):
        level = sandbox.isolation_level(isolation)
        sandbox.isolation_level(isolation)  # once per level, not once per run
    lines = [
        r.getMessage() for r in caplog.records if "code_tests sandbox: isolation=" in r.getMessage()
    ]
    assert len(lines) == 1 and f"isolation={level}" in lines[0]
    expected = sandbox_cgroup.hierarchy()
    assert (expected.describe() if expected else "per-process rlimits only") in lines[0]


def test_the_cli_shows_the_isolation_line():
    import grpo_plugin.cli as cli

    cli.quiet_logs()
    assert logging.getLogger("reward_fns").getEffectiveLevel() == logging.INFO


def test_cgroup_hierarchy_is_found_from_proc_files():
    v1 = "4:memory:/jobs/a\n8:pids:/\n0::/\n"
    mountinfo = (
        "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        "39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
    )
    found = sandbox_cgroup.find_hierarchy(v1, mountinfo)
    assert found == sandbox_cgroup.Hierarchy(
        1, ("/sys/fs/cgroup/memory/jobs/a", "/sys/fs/cgroup/pids")
    )
    assert sandbox_cgroup.find_hierarchy("0::/\n", "1 0 0:1 / / rw - ext4 /dev/x rw\n") is None


def test_without_throwaway_uids_the_process_cap_adds_the_uids_own_tasks():
    """Not root: the program shares the trainer's uid, whose threads RLIMIT_NPROC counts too."""
    import threading

    limits = sandbox.SandboxLimits(max_processes=32)
    assert sandbox._rlimits(limits)["RLIMIT_NPROC"] == [32, 32]
    shared = sandbox._rlimits(limits, shared_uid=True)["RLIMIT_NPROC"][0]
    assert shared >= 32 + threading.active_count()  # at least this process's own threads
