"""The generated `code` dataset: templates, splits, hidden tests scored by code_tests, the spec."""

from __future__ import annotations

import ast
import random

import pytest

import reward_fns
from grpo_plugin.app import code_tasks
from grpo_plugin.app.code_templates import FAMILIES, SPLITS, TEMPLATES, parameters
from grpo_plugin.app.data import (
    has_held_out,
    known_columns,
    load_prompt_datasets,
    parse_dataset_arg,
    validate_dataset_spec,
)
from grpo_plugin.app.splits import load_splits
from reward_fns import sandbox

# A short correct solution per template, written apart from the references that computed the
# expected values: {fn} is the requested name, {k} {ch} ... the prompt's parameters.
SOLUTIONS = {
    "reverse_string": "def {fn}(s): return ''.join(reversed(s))",
    "count_vowels": "def {fn}(s): return len([c for c in s if c in 'aeiouAEIOU'])",
    "capitalize_words": "def {fn}(s): return ' '.join(w.capitalize() for w in s.split(' '))",
    "remove_char": "def {fn}(s): return ''.join(c for c in s if c != {ch!r})",
    "repeat_string": "def {fn}(s): return ''.join([s] * {times})",
    "count_letter": "def {fn}(s): return sum(1 for c in s if c == {ch!r})",
    "first_chars": "def {fn}(s): return s[:{k}]",
    "count_words": "def {fn}(s): return len(s.split(' ')) if s else 0",
    "longest_word": (
        "def {fn}(s):\n    best = ''\n    for w in s.split():\n"
        "        if len(w) > len(best):\n            best = w\n    return best"
    ),
    "double_chars": "def {fn}(s): return ''.join(c + c for c in s)",
    "count_upper": "def {fn}(s): return len([c for c in s if 'A' <= c <= 'Z'])",
    "remove_vowels": "def {fn}(s): return ''.join(c for c in s if c not in 'aeiouAEIOU')",
    "starts_with": "def {fn}(s): return s[:1] == {ch!r}",
    "is_palindrome": "def {fn}(s): return list(s) == list(reversed(s))",
    "last_chars": "def {fn}(s): return s[max(0, len(s) - {k}):]",
    "replace_spaces": "def {fn}(s): return {ch!r}.join(s.split(' '))",
    "largest": "def {fn}(v): return sorted(v)[-1]",
    "sum_list": "def {fn}(v):\n    t = 0\n    for n in v:\n        t += n\n    return t",
    "running_sum": (
        "def {fn}(v):\n    out = []\n    for n in v:\n"
        "        out.append(n + (out[-1] if out else 0))\n    return out"
    ),
    "greater_than": "def {fn}(v): return list(filter(lambda n: n > {k}, v))",
    "count_evens": "def {fn}(v): return len([n for n in v if n % 2 == 0])",
    "remove_duplicates": (
        "def {fn}(v):\n    out = []\n    for n in v:\n        if n not in out:\n"
        "            out.append(n)\n    return out"
    ),
    "product": "def {fn}(v):\n    r = 1\n    for n in v:\n        r *= n\n    return r",
    "reverse_list": "def {fn}(v): return list(reversed(v))",
    "every_kth": "def {fn}(v): return [n for i, n in enumerate(v) if i % {k} == 0]",
    "multiply_each": "def {fn}(v): return [{k} * n for n in v]",
    "smallest": "def {fn}(v): return sorted(v)[0]",
    "contains": "def {fn}(v): return any(n == {k} for n in v)",
    "sum_of_squares": "def {fn}(v): return sum(n ** 2 for n in v)",
    "second_largest": "def {fn}(v):\n    top = max(v)\n    return max(n for n in v if n != top)",
    "index_of": (
        "def {fn}(v):\n    for i, n in enumerate(v):\n        if n == {k}:\n"
        "            return i\n    return -1"
    ),
    "odd_numbers": "def {fn}(v): return [n for n in v if n % 2 == 1]",
    "fizzbuzz": (
        "def {fn}(n):\n    if n % {d1} == 0 and n % {d2} == 0:\n        return 'FizzBuzz'\n"
        "    if n % {d1} == 0:\n        return 'Fizz'\n    if n % {d2} == 0:\n"
        "        return 'Buzz'\n    return str(n)"
    ),
    "factorial": "def {fn}(n): return 1 if n == 0 else n * {fn}(n - 1)",
    "sum_digits": (
        "def {fn}(n):\n    t = 0\n    while n:\n        t += n % 10\n        n //= 10\n    return t"
    ),
    "is_divisible": "def {fn}(n): return not n % {k}",
    "clamp": (
        "def {fn}(n):\n    if n < {lo}:\n        return {lo}\n    if n > {hi}:\n"
        "        return {hi}\n    return n"
    ),
    "abs_diff": "def {fn}(a, b): return a - b if a > b else b - a",
    "fibonacci": "def {fn}(n): return n if n < 2 else {fn}(n - 1) + {fn}(n - 2)",
    "gcd": "def {fn}(a, b):\n    while b:\n        a, b = b, a % b\n    return a",
    "is_even": "def {fn}(n): return not n & 1",
    "max_of_three": "def {fn}(a, b, c): return sorted([a, b, c])[2]",
    "count_digits": "def {fn}(n): return len(repr(n))",
    "power": "def {fn}(n):\n    r = 1\n    for _ in range({k}):\n        r *= n\n    return r",
    "round_down": "def {fn}(n): return n // {k} * {k}",
    "is_prime": "def {fn}(n): return n > 1 and all(n % d for d in range(2, n))",
    "reverse_digits": "def {fn}(n): return int(''.join(reversed(str(n))))",
    "sum_multiples": "def {fn}(n): return sum(m for m in range(1, n) if m % {k} == 0)",
}
VARIANTS_PER_TEMPLATE = 3


@pytest.fixture(scope="module")
def code_tests():
    """code_tests over many completions in one batched call; skipped where no sandbox runs."""
    try:
        sandbox.isolation_level("auto")
    except sandbox.IsolationError as err:
        pytest.skip(f"no sandbox here: {err}")
    fn = reward_fns.get("code_tests", timeout_s=10.0)

    def score(programs: list[str], tests: list[str]) -> list[float | None]:
        replies = [f"Here it is:\n```python\n{p}\n```" for p in programs]
        return fn(prompts=["p"] * len(replies), completions=replies, tests=tests)

    return score


def _expected_values(tests: str) -> list:
    """The right-hand sides of `assert call == expected`, as plain data."""
    body = ast.parse(tests).body
    assert all(isinstance(s, ast.Assert) and isinstance(s.test, ast.Compare) for s in body)
    return [ast.literal_eval(s.test.comparators[0]) for s in body]


def _called(tests: str) -> set[str]:
    return {s.test.left.func.id for s in ast.parse(tests).body}


def _rows(dataset) -> list[dict]:
    return [dataset[i] for i in range(len(dataset))]


def _one_row_per_template() -> list[dict]:
    train, test, validation = code_tasks.code_dataset(30, 9, 9, seed=5)
    rows = _rows(train) + _rows(test) + _rows(validation)
    assert sorted(r["template"] for r in rows) == sorted(t.name for t in TEMPLATES)
    return rows


# ----------------------------------------------------------------------------- the templates


def test_there_are_enough_templates_and_each_has_a_solution_here():
    names = [t.name for t in TEMPLATES]
    assert len(names) >= 40 and len(set(names)) == len(names)
    assert set(SOLUTIONS) == set(names)


def test_correct_solutions_pass_every_templates_tests(code_tests):
    rng = random.Random(11)
    programs, tests, where = [], [], []
    for template in TEMPLATES:
        for params in rng.sample(template.variants(), VARIANTS_PER_TEMPLATE):
            source = SOLUTIONS[template.name].format(fn=params["fn"], **parameters(params))
            programs.append(source)
            tests.append(template.tests(params, rng))
            where.append(f"{template.name} {params}")
    scores = code_tests(programs, tests)
    assert {w: s for w, s in zip(where, scores) if s != 1.0} == {}


def test_trivial_answers_fail(code_tests):
    """`return None` passes no test; returning the first argument never passes all of them."""
    rows = _one_row_per_template()
    none = [f"def {r['entry_point']}(*args):\n    return None" for r in rows]
    echo = [f"def {r['entry_point']}(*args):\n    return args[0]" for r in rows]
    tests = [r["tests"] for r in rows]
    scores = code_tests(none + echo, tests + tests)
    names = [r["template"] for r in rows]
    assert {n: s for n, s in zip(names, scores[: len(rows)]) if s != 0.0} == {}
    assert {n: s for n, s in zip(names, scores[len(rows) :]) if s == 1.0} == {}


def test_tests_are_four_or_five_asserts_of_plain_data_no_constant_passes():
    train, test, validation = code_tasks.code_dataset(256, 64, 64, seed=2)
    for row in _rows(train) + _rows(test) + _rows(validation):
        expected = _expected_values(row["tests"])
        assert 4 <= len(expected) <= 5, row
        assert _called(row["tests"]) == {row["entry_point"]}
        assert all(type(v) in (int, str, bool, list, tuple) for v in expected), row
        assert len({repr(v) for v in expected}) >= 2, row  # no constant answer passes them all


def test_requests_name_the_function_and_say_return_and_the_code_block():
    for row in _one_row_per_template():
        (message,) = row["prompt"]
        assert message["role"] == "user"
        request, instruction = message["content"].split("\n\n")
        assert request.startswith(f"Write a Python function `{row['entry_point']}(")
        assert " returns " in request and "print" not in request
        assert instruction == code_tasks.INSTRUCTION and "```python" in instruction


# ----------------------------------------------------------------------------- the splits


def test_splits_hold_disjoint_templates_of_all_three_families():
    by_split = {s: code_tasks.split_templates(s) for s in SPLITS}
    names = {s: {t.name for t in ts} for s, ts in by_split.items()}
    assert not names["train"] & names["test"]
    assert not names["train"] & names["validation"]
    assert not names["test"] & names["validation"]
    assert sum(map(len, names.values())) == len(TEMPLATES)
    assert len(names["train"]) >= 0.55 * len(TEMPLATES)
    for templates in by_split.values():
        assert {t.family for t in templates} == set(FAMILIES)
    train, test, validation = code_tasks.code_dataset(60, 18, 18)
    assert set(train["template"]) == names["train"]
    assert set(test["template"]) == names["test"]
    assert set(validation["template"]) == names["validation"]


def test_a_seed_fixes_the_rows_and_another_seed_changes_the_parameters():
    first = code_tasks.code_dataset(40, 12, 6, seed=3)
    again = code_tasks.code_dataset(40, 12, 6, seed=3)
    other = code_tasks.code_dataset(40, 12, 6, seed=4)
    for a, b, c in zip(first, again, other):
        assert a.to_dict() == b.to_dict()
        assert a["prompt"] != c["prompt"] and a["tests"] != c["tests"]


def test_train_and_test_do_not_depend_on_validation_and_grow_as_prefixes():
    train, test, none = code_tasks.code_dataset(20, 10, seed=1)
    with_validation = code_tasks.code_dataset(20, 10, 7, seed=1)
    assert none is None and len(with_validation[2]) == 7
    assert with_validation[0].to_dict() == train.to_dict()
    assert with_validation[1].to_dict() == test.to_dict()
    longer, _, _ = code_tasks.code_dataset(45, 10, seed=1)
    assert longer.select(range(20)).to_dict() == train.to_dict()


def test_a_full_split_has_no_repeated_prompt_and_one_more_row_is_refused():
    sizes = {s: code_tasks.split_capacity(s) for s in SPLITS}
    assert min(sizes.values()) >= code_tasks.CODE_EVAL_SIZE
    assert sizes["train"] >= code_tasks.CODE_TRAIN_SIZE
    for dataset in code_tasks.code_dataset(sizes["train"], sizes["test"], sizes["validation"]):
        texts = [m[-1]["content"] for m in dataset["prompt"]]
        assert len(set(texts)) == len(texts)
    with pytest.raises(ValueError, match=f"eval_size={sizes['test'] + 1} asks for more than"):
        code_tasks.code_dataset(8, sizes["test"] + 1)


def test_the_system_prompt_comes_first():
    train, _, _ = code_tasks.code_dataset(3, 1, system_prompt="You write Python.")
    for messages in train["prompt"]:
        assert messages[0] == {"role": "system", "content": "You write Python."}
        assert [m["role"] for m in messages] == ["system", "user"]


# ----------------------------------------------------------------------------- the spec


def test_the_spec_loads_train_and_test_with_the_known_columns():
    spec = {"name": "code", "train_size": 8, "eval_size": 4}
    train, held_out = load_prompt_datasets(spec)
    assert (len(train), len(held_out)) == (8, 4)
    assert train.column_names == held_out.column_names == known_columns(spec)
    assert known_columns(spec) == ["prompt", "tests", "template", "entry_point"]
    assert has_held_out(spec) and not has_held_out({**spec, "eval_size": 0})
    assert load_prompt_datasets({**spec, "eval_size": 0})[1] is None
    assert parse_dataset_arg("code") == {"name": "code"}


def test_the_spec_defaults_and_seed():
    train, held_out = load_prompt_datasets({"name": "code"})
    assert (len(train), len(held_out)) == (code_tasks.CODE_TRAIN_SIZE, code_tasks.CODE_EVAL_SIZE)
    seeded, _ = load_prompt_datasets({"name": "code", "train_size": 8, "seed": 9})
    assert seeded["tests"] == code_tasks.code_dataset(8, 0, seed=9)[0]["tests"]


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"name": "code", "low": 1}, "unknown key 'low' for code dataset"),
        ({"name": "code", "path": "x.jsonl"}, "unknown key 'path'"),
        ({"name": "code", "train_size": 10**6}, "train_size=1000000 asks for more than"),
        ({"name": "code", "validation_size": 10**4}, "validation_size=10000 asks for more"),
        ({"name": "code", "seed": "1"}, "seed must be an integer"),
        ({"name": "cod"}, "Did you mean 'code'"),
    ],
)
def test_a_bad_spec_is_named(spec, match):
    with pytest.raises(ValueError, match=match):
        validate_dataset_spec(spec)


def test_load_splits_takes_validation_from_the_validation_templates():
    spec = {"name": "code", "train_size": 12, "eval_size": 6, "seed": 7}
    train, test = load_prompt_datasets(spec)
    splits = load_splits({**spec, "validation_size": 5})
    assert splits.train.to_dict() == train.to_dict()
    assert splits.test.to_dict() == test.to_dict()
    assert len(splits.validation) == 5
    validation_names = {t.name for t in code_tasks.split_templates("validation")}
    assert set(splits.validation["template"]) <= validation_names
    assert not set(splits.validation["template"]) & {*train["template"], *test["template"]}
    with pytest.raises(ValueError, match="validation_size"):
        load_splits({**spec, "validation_size": 10**4})
