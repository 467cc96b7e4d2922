"""code_outcomes: why each program passed or failed, as code_tests hands it to a trainer."""

from __future__ import annotations

from collections import defaultdict

import pytest
import sandbox_checks

import reward_fns
from reward_fns import code_outcomes

ADD_TESTS = "assert add(1, 2) == 3\nassert add(-1, 1) == 0\nassert add(2, 2) == 4"
PROGRAMS = {  # one per outcome, for ADD_TESTS
    "passed": "def add(a, b):\n    return a + b",
    "partial": "def add(a, b):\n    return 3 if a == 1 else 1",  # 1 of 3
    "wrong_answer": "def add(a, b):\n    return a - b - 1",
    "runtime_error": "raise RuntimeError('boom')\ndef add(a, b):\n    return a + b",
    "timeout": "while True:\n    pass",
    "syntax_error": "def add(a, b)\n    return a + b",
    "no_function": "def plus(a, b):\n    return a + b",
}


@pytest.fixture(autouse=True)
def leaves_nothing():
    before = sandbox_checks.snapshot()
    yield
    assert sandbox_checks.snapshot() == before


def _score_logged(completions: list[str], tests: list):
    metrics: dict[str, list[float]] = defaultdict(list)
    columns: dict[str, list] = {}
    fn = reward_fns.get("code_tests", timeout_s=1.0)
    scores = fn(
        prompts=["p"] * len(completions),
        completions=completions,
        tests=tests,
        log_metric=lambda name, value: metrics[name].append(value),
        log_extra=columns.__setitem__,
    )
    return scores, metrics, columns


def test_each_outcome_is_named_and_the_shares_sum_to_one():
    names = list(PROGRAMS)
    completions = [f"```python\n{PROGRAMS[n]}\n```" for n in names] + ["", "Sorry, no code."]
    scores, metrics, columns = _score_logged(completions, [ADD_TESTS] * len(completions))
    assert columns["code_outcome"] == [*names, "no_function", "no_function"]
    assert scores == pytest.approx([1.0, 1 / 3, 0, 0, 0, 0, 0, 0, 0])
    n = len(completions)
    shares = {k.removeprefix(code_outcomes.METRIC_PREFIX): sum(v) / n for k, v in metrics.items()}
    assert set(shares) == set(code_outcomes.OUTCOMES)
    assert shares["no_function"] == pytest.approx(3 / 9)  # "plus", the empty reply, the prose
    assert shares["passed"] == pytest.approx(1 / 9)
    assert sum(shares.values()) == pytest.approx(1.0)
    assert all(len(v) == n for v in metrics.values())


def test_unreadable_tests_are_left_out_of_the_shares():
    scores, metrics, columns = _score_logged(["def add(a, b): return a + b"] * 2, [ADD_TESTS, "("])
    assert scores == [1.0, None]
    assert columns["code_outcome"] == ["passed", None]
    assert metrics[code_outcomes.METRIC_PREFIX + "passed"] == [1.0]


def test_stdin_stdout_cases_crash_time_out_or_answer_wrong():
    cases = [{"input": "2\n", "output": "4\n"}]
    programs = ["print(int(input()) * 2)", "print(3)", "import sys; sys.exit(3)", "while 1: pass"]
    _, _, columns = _score_logged(programs, [cases] * len(programs))
    assert columns["code_outcome"] == ["passed", "wrong_answer", "runtime_error", "timeout"]


def test_code_that_does_not_compile_starts_no_sandbox(monkeypatch):
    from reward_fns import code as code_mod

    calls = []
    real = code_mod.run_python
    monkeypatch.setattr(code_mod, "run_python", lambda *a, **k: calls.append(a) or real(*a, **k))
    scores, _, columns = _score_logged(
        ["def add(a, b) return a", "def f(\n  x = (", "def add(a, b): return a + b"],
        [ADD_TESTS] * 3,
    )
    assert scores == [0.0, 0.0, 1.0]
    assert columns["code_outcome"] == ["syntax_error", "syntax_error", "passed"]
    assert len(calls) == 1


def test_names_the_tests_call_skip_their_own_builtins_modules_and_locals():
    tests = (
        "import math\nfrom collections import Counter\nx = 2\n"
        "def check(candidate):\n    assert candidate(helper) == 1\n"
        "assert math.isclose(area(x), 1.0)\nassert Counter(words('a b')) == {}\ncheck(solve)"
    )
    assert code_outcomes.names_tests_call(tests) == {"area", "words", "solve"}
    assert code_outcomes.defined_names(
        "import os.path as p\nfrom math import pi\nclass A: pass\nfor i in []: pass\n"
        "def f():\n    inner = 1\nif True:\n    g = lambda: 0"
    ) == {"p", "pi", "A", "i", "f", "g"}
    assert code_outcomes.defined_names("def broken(") == set()


def test_a_reward_called_without_a_trainer_logs_nothing():
    fn = reward_fns.get("code_tests", timeout_s=1.0)
    assert fn(prompts=["p"], completions=[PROGRAMS["passed"]], tests=[ADD_TESTS]) == [1.0]
