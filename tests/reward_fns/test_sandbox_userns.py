"""Level ``bwrap-user`` (issue 12): a minimal root and an unforgeable verdict without root.

The trainer side runs as a non-root uid (``tests/reward_fns/nonroot_trainer.py``, under
``setpriv --reuid=65534`` when the tests run as root), where the program, the judge and the
trainer all share one uid. Every attack below scores 0 at ``bwrap-user`` and leaves nothing
behind; the ones that read the trainer are also run at ``rlimits`` (same uid, no namespaces),
where they must succeed: that proves each attack works, so its 0 comes from the level.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest
from conftest import REPO_ROOT
from test_code_judge import FORGED_TESTS, FORGERIES
from test_reward_code import ADD_TESTS, HOSTILE, TIMEOUT_S
from test_sandbox_isolation import READS, WALK, _allowed

from reward_fns import sandbox, sandbox_launch, sandbox_root

SECRET = "S3CR3T-" + uuid.uuid4().hex  # the expected answer: in the trainer's memory and env,
IO = [{"input": "what is the secret?\n", "output": SECRET + "\n"}]  # (stdin/stdout case)
ASSERT = f"assert answer() == {SECRET!r}"  # and in the judge's too (assert case)
CONST = "assert ANSWER == 41 + 1\nassert MOD == 10**9 + 7"
PATTERN = r"rb'S3CR3T-[0-9a-f]{32}'"
FOUND = """
secret = sorted(found)[0].decode() if found else 'nothing'
print(secret)
def answer():
    return secret
"""
# The attacks visit the processes nearest to them first (their ancestors: the harness, the judge,
# the trainer), then the rest, newest first, and stop at the first find. A scan of every process
# in order of PID read the whole memory of the big pytest process first and, on a loaded CI
# machine, ran past the 10 s limit before it reached the trainer.
PIDS = """
def pids_nearest_first():
    me, chain, pid = os.getpid(), [], os.getpid()
    while True:
        try:
            pid = int(open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        if pid <= 0 or pid in chain:
            break
        chain.append(pid)
    rest = sorted((int(p) for p in os.listdir('/proc') if p.isdigit()), reverse=True)
    return [p for p in dict.fromkeys(chain + rest) if p != me]
"""
# The audit's attacks on a same-uid trainer (each scored 1.0 at rlimits when not root), aimed at
# every process in sight, the judge included: it holds the tests and the verdict descriptor.
SCAN_PROC = f"""
import os, re
pat, found = re.compile({PATTERN}), set()
{PIDS}
for pid in pids_nearest_first():
    if found:
        break
    fds = []
    try:  # files and memfds only: reading another run's pipe would block
        for fd in os.listdir(f'/proc/{{pid}}/fd'):
            if os.readlink(f'/proc/{{pid}}/fd/{{fd}}').startswith('/'):
                fds.append(f'fd/{{fd}}')
    except OSError:
        pass
    for name in ['environ', 'cmdline', *fds]:
        try:
            found.update(pat.findall(open(f'/proc/{{pid}}/{{name}}', 'rb').read(1 << 22)))
        except OSError:
            pass
    try:
        maps = open(f'/proc/{{pid}}/maps').read().splitlines()
        mem = open(f'/proc/{{pid}}/mem', 'rb', 0)
    except OSError:
        continue
    for line in maps:
        a, b = (int(x, 16) for x in line.split()[0].split('-'))
        try:
            mem.seek(a)
            found.update(pat.findall(mem.read(min(b - a, 1 << 26))))
        except (OSError, ValueError, OverflowError):
            pass
{FOUND}"""
PTRACE = f"""
import ctypes, os, re
libc = ctypes.CDLL(None, use_errno=True)
pat, found = re.compile({PATTERN}), set()
class iovec(ctypes.Structure):
    _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]
{PIDS}
for pid in pids_nearest_first():
    if found:
        break
    libc.ptrace(0x4206, pid, 0, 0)  # PTRACE_SEIZE
    try:
        maps = open(f'/proc/{{pid}}/maps').read().splitlines()
    except OSError:
        continue
    for line in maps:
        a, b = (int(x, 16) for x in line.split()[0].split('-'))
        n = min(b - a, 1 << 24)
        buf = ctypes.create_string_buffer(n)
        local, remote = iovec(ctypes.addressof(buf), n), iovec(a, n)
        got = libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got > 0:
            found.update(pat.findall(buf.raw[:got]))
{FOUND}"""
MEMFDS = """
import os, sys
def memfds(name):  # every descriptor named `name` of every process we can see
    for pid in (p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()):
        try:
            fds = os.listdir(f'/proc/{pid}/fd')
        except OSError:
            continue
        for fd in fds:
            try:
                if name in os.readlink(f'/proc/{pid}/fd/{fd}'):
                    yield f'/proc/{pid}/fd/{fd}'
            except OSError:
                pass
"""
READ_TESTS_MEMFD = f"""{MEMFDS}
import re
pat, found = re.compile({PATTERN}), set()
for path in memfds('reward_fns-tests'):
    found.update(pat.findall(open(path, 'rb').read()))
print('targets', len(list(memfds('reward_fns-tests'))), file=sys.stderr)
{FOUND}"""
OVERWRITE_RESULTS_MEMFD = f"""{MEMFDS}
import time
targets = list(memfds('reward_fns-results'))
print('targets', len(targets), file=sys.stderr, flush=True)
if targets and os.fork() == 0:
    fds = [os.open(t, os.O_WRONLY) for t in targets]
    end = time.monotonic() + 8
    while time.monotonic() < end:
        for fd in fds:
            os.pwrite(fd, b'P\\nE\\n', 0)
        time.sleep(0.0005)
    os._exit(0)
def answer():
    return None  # fails the assert: any point would be forged
"""
CLAIM_MOCK_ANY = """
import sys
h = sys.modules.get('_code_harness') or sys.modules.get('reward_fns._code_harness')
claim = {'g': ['unittest.mock', 'ANY']}
h._Server.exports = lambda self: {'ANSWER': claim, 'MOD': claim}
ANSWER, MOD = 7, 8
"""
READS_OF_THE_TRAINER = {  # name: (program, tests); at rlimits each finds the secret
    "proc_environ_cmdline_fd_mem_scan": (SCAN_PROC, IO),
    "proc_environ_cmdline_fd_mem_scan_asserts": (SCAN_PROC, ASSERT),
    "ptrace_seize_and_process_vm_readv": (PTRACE, IO),
    "ptrace_seize_and_process_vm_readv_asserts": (PTRACE, ASSERT),
    "read_the_tests_memfd_via_proc_pid_fd": (READ_TESTS_MEMFD, ASSERT),
}
AUDIT_ATTACKS = {
    **READS_OF_THE_TRAINER,
    "overwrite_the_results_memfd_via_proc_pid_fd": (OVERWRITE_RESULTS_MEMFD, ASSERT),
    "claim_the_judges_unittest_mock_ANY": (CLAIM_MOCK_ANY, CONST),
}
INSIDE = """
import ctypes, os
status = dict(line.split(':\\t', 1) for line in open('/proc/self/status').read().splitlines())
print(sorted(p for p in os.listdir('/proc') if p.isdigit()), os.getpid(), os.getppid())
print(*(status[k].strip() for k in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb', 'NoNewPrivs')))
libc = ctypes.CDLL(None, use_errno=True)
print(libc.unshare(0x10000000), os.strerror(ctypes.get_errno()))  # a user namespace of its own
for path in ('/proc/1/environ', '/proc/1/mem', '/proc/1/fd'):
    try:
        os.listdir(path) if path.endswith('fd') else open(path, 'rb').read(1)
        print('read', path)
    except OSError as exc:
        print(exc.strerror)
"""
COUNT_FORKS = """
import os, time
n = 0
for _ in range(100):
    try:
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
        n += 1
    except OSError:
        break
print(n)
"""


def code_job(isolation: str, cases: dict, timeout_s: float = 10.0) -> dict:
    names = sorted(cases)
    return {
        "isolation": isolation,
        "timeout_s": timeout_s,
        "codes": [cases[n][0] for n in names],
        "tests": [cases[n][1] for n in names],
    }


def program_job(isolation: str, program: str, **extra) -> dict:
    return {"isolation": isolation, "timeout_s": 10.0, "program": program, **extra}


def scores(report: dict, job: str, cases: dict) -> dict:
    return dict(zip(sorted(cases), report["jobs"][job]["scores"]))


def trainer_command() -> list[str]:
    """How to start a trainer that is not root: directly, or as uid 65534 when we are root."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nonroot_trainer.py")
    if os.geteuid() != 0:
        return [sys.executable, here, str(REPO_ROOT)]
    if not shutil.which("setpriv"):
        pytest.skip("running as root without util-linux setpriv to start a non-root trainer")
    if not sandbox_launch._world_readable(str(REPO_ROOT)):
        pytest.skip(f"uid 65534 cannot read the checkout {REPO_ROOT}")
    try:
        python = sandbox_launch.rlimits_python()  # an interpreter other uids can run
    except sandbox.IsolationError as exc:
        pytest.skip(f"no interpreter uid 65534 can run: {exc}")
    setpriv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    return [*setpriv, python, here, str(REPO_ROOT)]


@pytest.fixture(scope="module")
def report():
    hidden = f"/tmp/hidden-tests-{uuid.uuid4().hex}.json"
    with open(hidden, "w") as f:
        f.write('{"expected_output": "1234567"}')
    os.chmod(hidden, 0o644)
    reads = {name: (code, [{"input": "", "output": out}]) for name, (code, out) in READS.items()}
    forgeries = {name: (code, FORGED_TESTS) for name, code in FORGERIES.items()}
    forgeries["right_answer"] = ("import math\ndef add(a, b): return a + b", FORGED_TESTS)
    jobs = {
        "reads": code_job("bwrap-user", reads),
        "attacks": code_job("bwrap-user", AUDIT_ATTACKS),
        "hostile": code_job(
            "bwrap-user", {n: (c, ADD_TESTS) for n, c in HOSTILE.items()}, TIMEOUT_S
        ),
        "forgeries": code_job("bwrap-user", forgeries),
        "walk": program_job("bwrap-user", WALK),
        "inside": program_job("bwrap-user", INSIDE),
        "forks": program_job("bwrap-user", COUNT_FORKS, trainer_threads=40),
        # Controls, last: rlimits leaves its killed processes to the trainer (our subreaper).
        "reads_rlimits": code_job("rlimits", reads),
        "attacks_rlimits": code_job("rlimits", READS_OF_THE_TRAINER, 30.0),
        "overwrite_rlimits": program_job("rlimits", OVERWRITE_RESULTS_MEMFD, tests=ASSERT),
    }
    env = {"PATH": sandbox_launch.SAFE_PATH, "OMP_NUM_THREADS": "1", "TRAINER_SECRET": SECRET}
    try:
        done = subprocess.run(
            trainer_command(), input=json.dumps(jobs), capture_output=True, text=True,
            env={**env, "PYTHONDONTWRITEBYTECODE": "1"}, timeout=300, check=False,
        )  # fmt: skip
    finally:
        os.remove(hidden)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    if found["why_not"]:
        pytest.skip(f"isolation 'bwrap-user' unavailable here: {found['why_not']}")
    return found


def test_without_root_auto_and_strict_choose_bwrap_user_and_say_so(report):
    assert report["uid"] != 0
    assert report["auto"] == report["strict"] == "bwrap-user"
    (line,) = [line for line in report["log"] if "isolation=bwrap-user" in line]  # once
    assert "minimal root" in line and "memory_mb holds per process" in line


def test_files_outside_the_sandbox_cannot_be_read(report):
    assert scores(report, "reads", READS) == dict.fromkeys(READS, 0.0)
    assert scores(report, "reads_rlimits", READS) == dict.fromkeys(READS, 1.0)  # they work


def test_the_whole_tree_is_the_allow_list(report):
    paths = report["jobs"]["walk"]["stdout"].split()
    stdlib = next(p for p in paths if p.endswith("/os.py")).rsplit("/", 1)[0]
    assert stdlib.startswith("/usr/local/lib/python3.")
    assert [p for p in paths if not _allowed(p, stdlib)] == []
    assert {p[1:] for p in paths if p.count("/") == 1} <= sandbox_root.TOP_LEVEL


def test_the_audits_same_uid_attacks_score_zero(report):
    assert scores(report, "attacks", AUDIT_ATTACKS) == dict.fromkeys(AUDIT_ATTACKS, 0.0)
    control = report["jobs"]["attacks_rlimits"]  # the attacks work where nothing isolates them
    assert scores(report, "attacks_rlimits", READS_OF_THE_TRAINER) == dict.fromkeys(
        READS_OF_THE_TRAINER, 1.0
    ), f"{control['seconds']} s; log: {control['log'][-10:]}"
    control = report["jobs"]["overwrite_rlimits"]["stderr"]
    assert "targets 0" not in control  # at rlimits it reaches the trainer's results descriptor


def test_the_hostile_suite_scores_zero(report):
    assert scores(report, "hostile", HOSTILE) == dict.fromkeys(HOSTILE, 0.0)


def test_forged_answers_score_zero(report):
    got = report["jobs"]["forgeries"]["scores"]
    names = sorted([*FORGERIES, "right_answer"])
    assert dict(zip(names, got)) == {**dict.fromkeys(FORGERIES, 0.0), "right_answer": 1.0}


def test_the_program_sees_only_its_namespace_and_holds_no_capability(report):
    pids, caps, userns, *init = report["jobs"]["inside"]["stdout"].splitlines()
    assert pids == "['1', '2'] 2 1"  # itself (PID 2) and its parent, PID 1 of the namespace
    assert init == ["Permission denied"] * 3  # PID 1 is not dumpable
    assert caps.split() == ["0000000000000000"] * 5 + ["1"]
    assert userns.split()[0] == "-1"  # no further user namespace


def test_the_process_cap_counts_the_programs_tree_not_the_trainers_tasks(report):
    # 40 idle threads of the trainer's uid would use up a per-uid cap of 32
    assert int(report["jobs"]["forks"]["stdout"]) == 32 - 1  # the program itself is one


def test_nothing_is_left_behind(report):
    left = {name: job["left"] for name, job in report["jobs"].items() if job["left"]}
    assert {name: v for name, v in left.items() if not name.endswith("_rlimits")} == {}


def test_strict_takes_bwrap_user_when_it_is_the_only_minimal_root(monkeypatch):
    available = {"bwrap-user", "rlimits"}
    monkeypatch.setattr(sandbox, "_why_not", lambda lvl: "" if lvl in available else "no root")
    sandbox._best_level.cache_clear()
    try:
        assert sandbox.isolation_level("strict") == sandbox.isolation_level("auto") == "bwrap-user"
        available.discard("bwrap-user")
        sandbox._best_level.cache_clear()
        with pytest.raises(sandbox.IsolationError, match="bwrap-user: no root.*user namespaces"):
            sandbox.isolation_level("strict")
    finally:
        sandbox._best_level.cache_clear()


def test_bwrap_user_is_for_the_non_root_user_only():
    if os.geteuid() != 0:
        pytest.skip("as non-root, bwrap-user is what the tests above run")
    with pytest.raises(sandbox.IsolationError, match="running as root"):
        sandbox.isolation_level("bwrap-user")
