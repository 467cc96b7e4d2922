"""Numeric answer verifiers: tricky formats, and agreement with GSM8K's human-checked labels."""

from __future__ import annotations

import json

import pytest
from conftest import GSM8K_DIR

import reward_fns

DATA = GSM8K_DIR
MODEL_KEYS = ("6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification")


def score(name: str, completion, gold) -> float | None:
    return reward_fns.get(name)(prompts=["q"], completions=[completion], answer=[gold])[0]


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        ("42", 42, 1.0),
        (" 42\n", "42", 1.0),
        ("+42", 42, 1.0),
        ("042", 42, 1.0),  # the seed's int() accepts leading zeros
        ("-7", -7, 1.0),
        ("-7", 7, 0.0),
        ("42.0", 42, 0.0),
        ("4 2", 42, 0.0),
        ("4_2", 42, 0.0),  # int() would accept this
        ("\u0664\u0662", 42, 0.0),  # Arabic-Indic digits: int() would accept these too
        ("The answer is 42", 42, 0.0),
        ("", 42, 0.0),
        ("42", "#### 42", 1.0),
        ("42", 42.0, 1.0),
        ("42", 2.5, None),  # a non-integer gold cannot be scored
        ("42", "no gold here", None),
    ],
)
def test_exact_integer(completion, gold, expected):
    assert score("exact_integer", completion, gold) == expected


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        ("3 + 4 = 7", 7, 1.0),
        ("I think 7. No wait, 8", 7, 0.0),
        ("The sum is 1,234.", 1234, 1.0),
        ("answer: -5", -5, 1.0),
        ("5-3=2", 2, 1.0),
        ("5-3", -3, 0.0),  # subtraction, not a negative number
        ("it is 3.5", 5, 0.0),  # the 5 of 3.5 is not an integer
        ("it is 3.5", 3, 0.0),
        ("x2 = 9", 9, 1.0),
        ("no digits", 1, 0.0),
        ("7", "#### 7", 1.0),
    ],
)
def test_last_integer(completion, gold, expected):
    assert score("last_integer", completion, gold) == expected


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        ("#### 42", "42", 1.0),
        ("The answer is 42.", "#### 42", 1.0),
        ("so \\boxed{42} is it", 42, 1.0),
        ("work...\nA: 42", "42", 1.0),
        ("She has $1,234.00 left.", "#### 1234", 1.0),
        ("The answer is \\$18.", 18, 1.0),
        ("The answer is -3", -3, 1.0),
        ("The answer is \u22125", -5, 1.0),  # unicode minus
        ("The answer is 3/4", 0.75, 1.0),
        ("\\boxed{\\frac{3}{4}}", "0.75", 1.0),
        ("\\boxed{\\dfrac{1}{2}}", "1/2", 1.0),
        ("It costs 18 dollars", 18, 1.0),
        ("The answer is 50%", 50, 1.0),
        ("The answer is 0.50", "#### 0.5", 1.0),
        ("\\boxed{1{,}000}", 1000, 1.0),
        ("Total: 1,000,000 grains", 1000000, 1.0),
        ("3*4=<<3*4=12>>12 eggs", 12, 1.0),  # GSM8K calculator annotations
        ("The answer is 42. Check: 6*7 = 42, plus 1 is 43", 42, 1.0),  # marker beats last number
        ("#### 18\nThen 5 more", 18, 1.0),
        ("I got 7 but the answer is 8", 7, 0.0),
        ("The total is 5", 6, 0.0),
        ("no numbers at all", 6, 0.0),
        ("The answer is 12.5", 12, 0.0),
        ("\\boxed{x = 5}", 5, 1.0),
        ([{"role": "assistant", "content": "#### 9"}], 9, 1.0),
        ("42", "the gold has no number", None),
        ("42", None, None),
    ],
)
def test_gsm8k_formats(completion, gold, expected):
    assert score("gsm8k", completion, gold) == expected


def test_missing_column_explains_fix():
    with pytest.raises(ValueError, match="needs a dataset column 'answer'"):
        reward_fns.get("gsm8k")(completions=["1"], solution=["1"])
    fn = reward_fns.get("gsm8k", column_name="solution")
    assert fn(completions=["1"], solution=["#### 1"]) == [1.0]


def _load(name: str) -> list[dict]:
    path = DATA / name
    if not path.exists():
        pytest.skip(f"{path} not found (the project's shared GSM8K copy)")
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_gsm8k_agrees_with_human_labels(record_property):
    rows = _load("example_model_solutions.jsonl")
    completions, golds, labels = [], [], []
    for row in rows:
        for key in MODEL_KEYS:
            completions.append(row[key]["solution"])
            golds.append(row["ground_truth"])
            labels.append(float(row[key]["is_correct"]))
    scores = reward_fns.get("gsm8k")(completions=completions, answer=golds)
    agreement = sum(s == label for s, label in zip(scores, labels)) / len(labels)
    record_property("gsm8k_agreement", agreement)
    print(f"\ngsm8k verifier agreement with is_correct: {agreement:.4%} over {len(labels)}")
    assert len(labels) == 5276
    assert 0.25 < sum(labels) / len(labels) < 0.75  # both classes are well represented
    assert agreement >= 0.995


def test_gsm8k_reference_solutions_score_one():
    rows = _load("test.jsonl") + _load("train.jsonl")
    answers = [row["answer"] for row in rows]
    assert reward_fns.get("gsm8k")(completions=answers, answer=answers) == [1.0] * len(rows)
    shifted = answers[1:] + answers[:1]  # someone else's gold: nearly always wrong
    wrong = reward_fns.get("gsm8k")(completions=answers, answer=shifted)
    assert sum(wrong) / len(wrong) < 0.05
