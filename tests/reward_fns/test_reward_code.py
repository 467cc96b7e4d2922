"""code_tests: extraction, test formats, full-output comparison, hostile code, throughput."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid

import pytest
import sandbox_checks
from sandbox_checks import children_of, sandbox_processes

import reward_fns
from reward_fns import code as code_mod
from reward_fns import sandbox

TIMEOUT_S = 2.0
ADD_TESTS = "assert add(1, 2) == 3\nassert add(-1, 1) == 0\nassert add(2, 2) == 4"


@pytest.fixture(autouse=True)
def leaves_nothing():
    """No process, cgroup, mount or host /tmp folder outlives a test (issue 12)."""
    before = sandbox_checks.snapshot()
    yield
    assert sandbox_checks.snapshot() == before


def fence(src: str, lang: str = "python") -> str:
    return f"Here is my solution:\n```{lang}\n{src}\n```\nDone."


def code_tests(completions, tests, **params):
    fn = reward_fns.get("code_tests", timeout_s=TIMEOUT_S, **params)
    return fn(prompts=["p"] * len(completions), completions=completions, tests=tests)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("```python\nprint(1)\n```", "print(1)\n"),
        ("```py\na=1\n```\ntext\n```python\nb=2\n```", "b=2\n"),  # the last block
        ("```\nplain\n```", "plain\n"),
        ("no fences, just code = 1", "no fences, just code = 1"),
        ("```python\nx = 1\n```\n```python\ny = 2", "y = 2"),  # truncated final block
    ],
)
def test_extract_code(text, expected):
    assert code_mod.extract_code(text) == expected


def test_parse_tests_formats():
    io = [{"input": "1\n", "output": "2\n"}]
    assert code_mod.parse_tests(io) == ("io", [("1\n", "2\n")])
    assert code_mod.parse_tests({"inputs": ["1\n"], "outputs": ["2\n"]}) == ("io", [("1\n", "2\n")])
    assert code_mod.parse_tests('[{"input": "1", "output": "2"}]') == ("io", [("1", "2")])
    assert code_mod.parse_tests(ADD_TESTS) == ("asserts", (ADD_TESTS, 3))
    for bad in ("assert (", "", [], [{"input": "1"}], None, {"inputs": ["1"], "outputs": []}):
        assert code_mod.parse_tests(bad) is None


@pytest.mark.parametrize(
    "actual, expected, same",
    [
        ("1\n2\n3\n", "1\n2\n3", True),
        ("1 \n2\r\n3\n\n\n", "1\n2\n3\n", True),
        ("1\n2\n", "1\n2\n3\n", False),  # open-r1's zip() would call this a pass
        ("1\n2\n3\n4\n", "1\n2\n3\n", False),
        (" 1\n", "1\n", False),
        ("", "", True),
    ],
)
def test_outputs_match_compares_all_lines(actual, expected, same):
    assert code_mod.outputs_match(actual, expected) is same


def test_scores_fraction_of_tests():
    double = [{"input": f"{i}\n", "output": f"{2 * i}\n"} for i in (1, 2, 3, 4)]
    completions = [
        fence("def add(a, b):\n    return a + b"),
        fence("def add(a, b):\n    return a + b if a > 0 else 99"),  # passes 2 of 3
        fence("print(int(input()) * 2)"),
        fence("n = int(input())\nprint(n * 2 if n < 3 else n)"),  # passes 2 of 4
        [{"role": "assistant", "content": fence("print(int(input()) * 2)")}],
        fence("print(1)"),
    ]
    tests = [ADD_TESTS, ADD_TESTS, double, double, double, "this is not python ("]
    scores = code_tests(completions, tests)
    assert scores == [1.0, pytest.approx(2 / 3), 1.0, 0.5, 1.0, None]


# Each program must end (the sandbox stops it at TIMEOUT_S) and score 0 against the add() tests.
HOSTILE = {
    "infinite_loop": "while True:\n    pass",
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "memory_bomb": "blocks = []\nwhile True:\n    blocks.append(bytearray(10**8))",
    "memory_bomb_at_once": "x = bytearray(64 * 1024**3)",
    "kill_parent": "import os\nos.kill(os.getppid(), 9)",
    "kill_everything": "import os\nos.kill(-1, 9)",
    "escape_session": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)",
    "stdout_flood": "import sys\nsys.stdout.write('x' * 100_000_000)",
    "stdout_flood_loop": "while True:\n    print('y' * 10_000)",
    "exit_before_tests": "import sys\nsys.exit(0)\ndef add(a, b):\n    return a + b",
    "hard_exit_before_tests": "import os\nos._exit(0)",
}


def returns_at_all(call, patience_s: float = 120.0):
    """`call()`'s result; fails the test if it has not returned after `patience_s` (a hang guard,
    far above the sandbox's own time limit: an outcome, not a speed check)."""
    result: list = []
    worker = threading.Thread(target=lambda: result.append(call()), daemon=True)
    worker.start()
    worker.join(patience_s)
    assert not worker.is_alive(), f"still running after {patience_s:.0f} s: the sandbox hung"
    return result[0]


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_code_is_contained(name):
    before = children_of(os.getpid())
    scores = returns_at_all(lambda: code_tests([fence(HOSTILE[name])], [ADD_TESTS]))
    assert scores == [0.0]
    assert sandbox_processes() == []
    assert children_of(os.getpid()) <= before


@pytest.mark.parametrize("name", ["fork_bomb", "kill_parent", "kill_everything", "escape_session"])
def test_rlimits_fallback_also_contains(name):
    """The no-namespace fallback: fewer walls, but the trainer and the machine stay safe."""
    if os.geteuid() != 0:
        pytest.skip("the fallback only drops to a throwaway uid when running as root")
    before = children_of(os.getpid())
    run = lambda: code_tests([fence(HOSTILE[name])], [ADD_TESTS], isolation="rlimits")  # noqa: E731
    assert returns_at_all(run) == [0.0]
    assert sandbox_processes() == []
    assert children_of(os.getpid()) <= before


@pytest.mark.parametrize("level", ["bwrap", "pivot_root"])
@pytest.mark.parametrize("name", ["fork_bomb", "kill_parent", "kill_everything", "escape_session"])
def test_each_root_level_also_contains(name, level):
    """``auto`` takes one level; the process attacks also at the other (PID 1 differs)."""
    if sandbox._why_not(level):
        pytest.skip(f"{level}: {sandbox._why_not(level)}")
    before = children_of(os.getpid())
    assert code_tests([fence(HOSTILE[name])], [ADD_TESTS], isolation=level) == [0.0]
    assert sandbox_processes() == []
    assert children_of(os.getpid()) <= before


def test_exit_zero_does_not_pass_stdio_case():
    tests = [{"input": "3\n", "output": "6\n"}]
    assert code_tests([fence("import sys\nsys.exit(0)\nprint(6)")], [tests]) == [0.0]
    assert code_tests([fence("print(6)\nimport sys\nsys.exit(0)")], [tests]) == [1.0]


def test_secrets_are_not_visible(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_super_secret_token")
    src = "import os\nprint(os.environ.get('HF_TOKEN', ''))\nprint(sorted(os.environ))"
    result = sandbox.run_python(src, limits=sandbox.SandboxLimits(5.0))
    assert result.returncode == 0
    first, names = result.stdout.splitlines()
    assert first == "" and "hf_super_secret_token" not in result.stdout
    assert "HF_TOKEN" not in names and "PATH" in names


@pytest.fixture
def namespaces_only():
    if sandbox.isolation_level() == "rlimits":
        pytest.skip("network and filesystem isolation need the 'namespaces' sandbox (unshare)")


def test_no_network_even_to_localhost(namespaces_only):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.5)
    port = server.getsockname()[1]
    src = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('connected')"
    try:
        result = sandbox.run_python(src)
        assert result.returncode != 0 and "connected" not in result.stdout
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()


def test_cannot_write_outside_workdir(namespaces_only, tmp_path):
    tag = uuid.uuid4().hex
    targets = [tmp_path / f"escape-{tag}", f"/tmp/escape-{tag}", f"/dev/shm/escape-{tag}"]
    lines = [
        f"try:\n    open({str(t)!r}, 'w').write('x')\n    print('wrote')\nexcept OSError:\n    pass"
        for t in targets
    ]
    src = (
        "\n".join(lines) + "\nopen('inside.txt', 'w').write('ok')\nprint(open('inside.txt').read())"
    )
    result = sandbox.run_python(src)
    assert result.stdout.split() == ["ok"]  # only the working directory is writable
    for target in targets:
        assert not os.path.exists(target)


def test_throughput_uses_all_cores(monkeypatch, record_property):
    active, peak = 0, 0
    lock = threading.Lock()
    real_run = code_mod.run_python

    def counting_run(*args, **kwargs):
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        try:
            return real_run(*args, **kwargs)
        finally:
            with lock:
                active -= 1

    monkeypatch.setattr(code_mod, "run_python", counting_run)
    n = 256
    completions = [fence(f"def add(a, b):\n    return a + b + {i % 2}") for i in range(n)]
    cpu_before = os.times()
    start = time.monotonic()
    scores = code_tests(completions, [ADD_TESTS] * n)
    wall = time.monotonic() - start
    cpu_after = os.times()
    child_cpu = (cpu_after.children_user - cpu_before.children_user) + (
        cpu_after.children_system - cpu_before.children_system
    )
    assert scores == [1.0 if i % 2 == 0 else 0.0 for i in range(n)]
    assert peak >= min(2, os.cpu_count() or 1)
    record_property("code_tests_per_second", n / wall)
    print(
        f"\ncode_tests: {n} completions in {wall:.2f}s ({n / wall:.0f}/s), "
        f"{peak} concurrent sandboxes, child CPU {child_cpu:.2f}s = {child_cpu / wall:.2f} cores"
    )
