"""app/splits.py: train, validation and test splits of a recipe's dataset."""

from __future__ import annotations

import json

import pytest

from grpo_plugin.app.data import load_prompt_datasets, validate_dataset_spec
from grpo_plugin.app.splits import load_splits


def _questions(dataset) -> list[str]:
    return [row["prompt"][-1]["content"] for row in dataset]


def test_arithmetic_validation_is_drawn_after_train_and_test_which_stay_the_same():
    spec = {"name": "arithmetic", "train_size": 10, "eval_size": 6, "seed": 3}
    train, test = load_prompt_datasets(spec)
    splits = load_splits({**spec, "validation_size": 5})
    assert _questions(splits.train) == _questions(train)
    assert _questions(splits.test) == _questions(test)
    validation = _questions(splits.validation)
    assert len(validation) == 5
    assert not set(validation) & (set(_questions(train)) | set(_questions(test)))


def test_a_file_gives_its_last_rows_to_validation_and_keeps_them_out_of_training(tmp_path):
    path = tmp_path / "data.jsonl"
    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(10)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    splits = load_splits({"path": str(path), "validation_size": 3, "train_size": 4})
    assert splits.train["prompt"] == ["q0", "q1", "q2", "q3"]
    assert splits.validation["prompt"] == ["q7", "q8", "q9"]
    assert splits.test is None
    with pytest.raises(ValueError, match="validation_size 10 leaves no training rows"):
        load_splits({"path": str(path), "validation_size": 10})


def test_without_validation_size_there_is_no_validation_split():
    splits = load_splits({"name": "arithmetic", "train_size": 4, "eval_size": 2})
    assert splits.validation is None and len(splits.test) == 2


@pytest.mark.parametrize("value", [-1, "8", True, 2.5])
def test_a_bad_validation_size_is_named(value):
    with pytest.raises(ValueError, match="validation_size"):
        validate_dataset_spec({"name": "arithmetic", "validation_size": value})
