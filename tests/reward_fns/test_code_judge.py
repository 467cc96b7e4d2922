"""The assert judge (issue 12): verdicts the candidate's code cannot forge.

In-process tests drive the real candidate server in a thread over pipes; the end-to-end ones go
through ``code_tests`` and the sandbox. Every forging program below scores 0.
"""

from __future__ import annotations

import math
import os
import threading

import pytest
import sandbox_checks

import reward_fns
from reward_fns import _code_harness, _code_wire, sandbox

ADD_TESTS = "assert add(1, 2) == 3\nassert add(-1, 1) == 0\nassert add(2, 2) == 4"


def fence(src: str) -> str:
    return f"```python\n{src}\n```"


def score(code: str, tests: str) -> float | None:
    fn = reward_fns.get("code_tests", timeout_s=10.0)
    return fn(prompts=["p"], completions=[fence(code)], tests=[tests])[0]


def judge_in_process(candidate: str, tests: str) -> list[bool]:
    """The judge and the candidate's server in one process, over the same pipes as in the
    sandbox (no isolation: for the protocol's logic only)."""
    namespace: dict = {"__name__": "__main__"}
    exec(candidate, namespace)
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    server = threading.Thread(target=_code_harness.serve, args=(namespace, req_r, resp_w))
    server.start()
    try:
        return _code_harness.judge(_code_harness.compile_tests(tests), req_w, resp_r, [])
    finally:
        os.close(req_w)  # the server sees EOF and returns
        server.join(timeout=10)
        for fd in (req_r, resp_r, resp_w):
            os.close(fd)


@pytest.fixture(autouse=True)
def leaves_nothing():
    before = sandbox_checks.snapshot()
    yield
    assert sandbox_checks.snapshot() == before


VALUES = [
    None, True, 0, -(2**70), 2**64, 1.5, float("inf"), "héllo\n", b"\x00\xff", 1 + 2j,
    [1, [2, "x"]], (1, (2,)), {(1, 2): {"a": [None]}}, {1, 2}, frozenset({"a"}), (),
]  # fmt: skip


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_values_cross_as_data_with_their_types(value):
    back = _code_wire.decode(_code_wire.encode(value, make_ref=id), resolve_ref=None)

    def shape(v):
        if isinstance(v, list | tuple | set | frozenset):
            return (type(v), sorted(map(repr, map(shape, v))))
        if isinstance(v, dict):
            return (dict, sorted(repr((shape(k), shape(x))) for k, x in v.items()))
        return (type(v), v)

    assert shape(back) == shape(value)
    assert math.isnan(_code_wire.decode(_code_wire.encode(float("nan"), id), None))


@pytest.mark.parametrize(
    "node",
    [{"t": [1], "s": [2]}, {"x": 1}, {"d": [[[1], 2]]}, {"r": "1"}, {"c": ["a", 1]}, {"i": 5}],
)
def test_decode_accepts_only_tagged_data(node):
    with pytest.raises((_code_wire.LinkError, TypeError, ValueError)):
        _code_wire.decode(node, resolve_ref=lambda ref: ref)


def test_a_handle_refuses_every_question_that_carries_the_expected_value():
    handle = _code_harness.Remote(link=None, ref=0)
    for question in (
        lambda: handle == 3,
        lambda: handle != 3,
        lambda: handle < 3,
        lambda: 3 in [handle],
        lambda: bool(handle),
        lambda: hash(handle),
        lambda: 3 in handle,
    ):
        with pytest.raises(TypeError):
            question()


def test_judge_follows_python_for_data_calls_objects_and_errors():
    candidate = """
import math
from collections import Counter
def add(a, b): return a + b
def pair(x): return (x, [x])
def is_even(n): return n % 2 == 0
def area(r): return math.pi * r * r
def gen(n):
    yield from range(n)
def sort_in_place(a): a.sort()
def safe_sqrt(x):
    if x < 0:
        raise ValueError("negative")
    return math.sqrt(x)
class Stack:
    def __init__(self): self.items = []
    def push(self, x): self.items.append(x)
    def pop(self): return self.items.pop()
    def __len__(self): return len(self.items)
    def __str__(self): return f"Stack{self.items}"
MOD = 10**9 + 7
"""
    tests = """
assert add(1, 2) == 3
assert add(10**30, 1) == 10**30 + 1
assert pair(2) == (2, [2]) and pair(2) != [2, [2]]
assert is_even(2) and not is_even(3)
assert add(1, 2) in (3, 4)
assert abs(area(2) - 12.566370614359172) < 1e-9
assert math.isclose(area(1), math.pi)
assert sorted(add([3], [1])) == [1, 3]
assert list(gen(3)) == [0, 1, 2]
a = [3, 1, 2]
sort_in_place(a)
assert a == [1, 2, 3]
try:
    safe_sqrt(-1)
    raise AssertionError("no error")
except ValueError:
    pass
assert safe_sqrt(4) == 2.0
s = Stack()
s.push(1)
s.push(2)
assert s.pop() == 2 and len(s) == 1 and str(s) == "Stack[1]"
assert MOD == 1000000007
assert Counter("aab") == {"a": 2, "b": 1}
"""
    assert judge_in_process(candidate, tests) == [True] * tests.count("\nassert ")
    wrong = candidate.replace("return a + b", "return a - b").replace("n % 2 == 0", "True")
    verdicts = judge_in_process(wrong, tests)
    assert verdicts[:5] == [False, False, True, False, False]
    assert verdicts[7] is False


def test_humaneval_style_check_function_is_one_test():
    tests = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(0, 0) == 0\ncheck(add)"
    assert judge_in_process("def add(a, b): return a + b", tests) == [True]
    assert judge_in_process("def add(a, b): return 3", tests) == [False]


def judge_with_exports(exports: dict, tests: str) -> list[bool]:
    """The judge against a fake candidate that only sends ``exports`` and hangs up."""
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    _code_wire.send(resp_w, {"exports": exports})
    os.close(resp_w)
    try:
        return _code_harness.judge(_code_harness.compile_tests(tests), req_w, resp_r, [])
    finally:
        for fd in (req_r, req_w, resp_r):
            os.close(fd)


def test_export_claims_bind_only_public_stdlib_objects():
    """The candidate may say `add` is `operator.add` (as `from operator import add` would);
    it cannot make the judge call a builtin or a private function with the tests' arguments."""
    tests = "assert add(1, 2) == 3"
    assert judge_with_exports({"add": {"g": ["operator", "add"]}}, tests) == [True]
    refused = (["builtins", "max"], ["sys", "_getframe"], ["operator", "__add__"], ["x", "y"],
               ["unittest.mock", "ANY"], ["sys", "modules.get"])  # fmt: skip
    for claim in refused:  # ANY: an always-equal stdlib instance; modules.get: a bound method
        assert judge_with_exports({"add": {"g": claim}}, "assert 'add' not in globals()") == [True]
    for claim in (["collections", "Counter"], ["posixpath", "join"], ["math", "isclose"]):
        assert judge_with_exports({"f": {"g": claim}}, "assert callable(f)") == [True]
    assert judge_with_exports(
        {"ANSWER": {"g": ["unittest.mock", "ANY"]}}, "assert ANSWER == 7"
    ) == [False]
    module_claim = {"math": {"m": "math"}, "add": {"d": [[1, 2]]}}
    assert judge_with_exports(module_claim, "assert math.sqrt(add[1]) == 2 ** 0.5") == [True]


def test_candidate_objects_are_not_compared_documented_limit():
    """A test that compares two of the code's own objects fails: only data is compared."""
    candidate = "class P:\n    def __init__(s, x): s.x = x\n    def __eq__(s, o): return s.x == o.x"
    assert judge_in_process(candidate, "assert P(1) == P(1)") == [False]


# Each returns a wrong answer dressed to pass; a plain wrong value (7, "x", 5) fails every
# assert below, so any point scored would be a forgery.
FORGERIES = {
    "always_equal_object": "class E:\n    def __eq__(s, o): return True\n"
    "    def __ne__(s, o): return False\n    def __hash__(s): return 0\n"
    "    def __lt__(s, o): return True\n    def __sub__(s, o): return s\n"
    "    def __abs__(s): return 0\n    def __mul__(s, o): return s\ndef add(a, b): return E()",
    "int_subclass_always_equal": "class E(int):\n    def __eq__(s, o): return True\n"
    "def add(a, b): return E(7)",
    "str_subclass_always_equal": "class E(str):\n    def __eq__(s, o): return True\n"
    "def add(a, b): return E('x')",
    "truthy_and_container": "class E:\n    def __bool__(s): return False\n"
    "    def __contains__(s, x): return True\ndef add(a, b): return E()",
    "shadowed_builtins": "def sorted(x): return [1, 2]\ndef len(x): return 2\ndef abs(x): return 0\n"
    "def add(a, b): return 5",
    "fake_math_module": "class math:\n    isclose = staticmethod(lambda *a, **k: True)\n"
    "def add(a, b): return 5",
    "exception_as_verdict": "def add(a, b): raise AssertionError('P')",
    "stop_iteration_ends_the_judges_map": "def add(a, b): raise StopIteration",
}
FORGED_TESTS = (
    "assert add(1, 2) == 3\nassert add(1, 2) in (3, 30)\nassert not add(-4, 4)\n"
    "assert math.isclose(add(1, 2), 3)\nassert sorted(add([2], [1])) == [1, 2]\n"
    "assert len(add('a', 'b')) == 2\nassert abs(add(1, 2) - 3) < 1e-9\nassert add(1, 2) * 2 == 6\n"
    "assert all(map(lambda p: add(*p) == sum(p), [(1, 2), (3, 4)]))"
)


def test_forged_answers_score_zero():
    names = sorted(FORGERIES)
    codes = [FORGERIES[name] for name in names] + ["import math\ndef add(a, b): return a + b"]
    fn = reward_fns.get("code_tests", timeout_s=10.0)
    scores = fn(["p"] * len(codes), [fence(c) for c in codes], tests=[FORGED_TESTS] * len(codes))
    assert dict(zip(names, scores)) == dict.fromkeys(names, 0.0)
    assert scores[-1] == 1.0  # the right answer passes all nine


def test_forging_the_result_descriptor_scores_zero():
    code = """
import glob, os
lines = b"P\\n" * 10 + b"E\\n"
for fd in range(3, 1024):
    try:
        os.write(fd, lines)
    except OSError:
        pass
for path in glob.glob("/proc/*/fd/*"):
    try:
        with open(path, "wb") as f:
            f.write(lines)
    except OSError:
        pass
print(lines.decode())
def add(a, b):
    return 0
"""
    assert score(code, ADD_TESTS) == 0.0
    result = sandbox.run_python(code, tests=ADD_TESTS, limits=sandbox.SandboxLimits(timeout_s=10.0))
    assert result.verdicts is None or result.verdicts == [False, False, False]


def test_the_tests_cannot_be_read_from_inside():
    """The program only solves the task if it finds the tests' text anywhere it can read."""
    code = """
import glob, os
seen = ""
for path in glob.glob("/proc/*/fd/*") + glob.glob("/proc/*/cmdline") + glob.glob("/proc/*/environ"):
    try:
        seen += open(path, "rb").read(1 << 20).decode("latin-1")
    except OSError:
        pass
for fd in range(0, 1024):
    try:
        os.lseek(fd, 0, 0)
        seen += os.read(fd, 1 << 20).decode("latin-1")
    except OSError:
        pass
if "assert add(" in seen:
    def add(a, b):
        return a + b
"""
    assert score(code, ADD_TESTS) == 0.0


def test_a_crash_keeps_the_verdicts_decided_before_it():
    code = "import os\ncalls = []\ndef add(a, b):\n    calls.append(1)\n    if len(calls) == 2:\n        os._exit(1)\n    return a + b"
    result = sandbox.run_python(code, tests=ADD_TESTS, limits=sandbox.SandboxLimits(timeout_s=10.0))
    assert result.verdicts == [True, False, False]


def test_garbage_on_the_channel_fails_the_tests_not_the_judge():
    code = "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'\\xff' * 64)\n    except OSError:\n        pass\ndef add(a, b): return a + b"
    result = sandbox.run_python(code, tests=ADD_TESTS, limits=sandbox.SandboxLimits(timeout_s=10.0))
    assert result.verdicts == [False, False, False]  # a complete verdict: the judge finished
