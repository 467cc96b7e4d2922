"""Prompt datasets: generated arithmetic, the real GSM8K jsonl, custom files and spec validation."""

from __future__ import annotations

import json

import pytest
from conftest import GSM8K_DIR
from datasets import Dataset

from grpo_plugin.app.data import (
    ArithmeticProblems,
    arithmetic_dataset,
    dataset_hub_ids,
    gsm8k_dataset,
    load_prompt_datasets,
    require_columns,
    validate_dataset_spec,
)

GSM8K_TRAIN = GSM8K_DIR / "train.jsonl"
GSM8K_TEST = GSM8K_DIR / "test.jsonl"
needs_gsm8k = pytest.mark.skipif(not GSM8K_TRAIN.is_file(), reason="shared GSM8K data not present")


def _pairs(dataset):
    return {m[-1]["content"] for m in dataset["prompt"]}


def test_arithmetic_answers_are_the_sums():
    train, held_out = arithmetic_dataset(16, 8, seed=1, problems=ArithmeticProblems(low=3, high=9))
    assert (len(train), len(held_out)) == (16, 8)
    for messages, answer in zip(train["prompt"], train["answer"]):
        assert messages == [{"role": "user", "content": messages[0]["content"]}]
        a, b = (
            int(x)
            for x in messages[0]["content"].removeprefix("What is ").removesuffix("?").split(" + ")
        )
        assert 3 <= a <= 9 and 3 <= b <= 9
        assert answer == str(a + b)


def test_arithmetic_is_seeded_and_splits_are_disjoint():
    train, held_out = arithmetic_dataset(64, 64, seed=0)
    again, _ = arithmetic_dataset(64, 64, seed=0)
    other, _ = arithmetic_dataset(64, 64, seed=1)
    assert train["prompt"] == again["prompt"]
    assert train["prompt"] != other["prompt"]
    assert len(_pairs(train)) == 64 and len(_pairs(held_out)) == 64
    assert not _pairs(train) & _pairs(held_out)


def test_arithmetic_template_and_system_prompt():
    wording = ArithmeticProblems(
        low=1, high=2, template="Add {a} and {b}.", system_prompt="Be brief."
    )
    train, _ = arithmetic_dataset(2, 1, problems=wording)
    first = train[0]["prompt"]
    assert first[0] == {"role": "system", "content": "Be brief."}
    assert first[1]["content"].startswith("Add ")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(n_train=3, n_eval=2, low=1, high=2), "distinct pairs"),  # only 4 pairs
        (dict(low=5, high=1), "low=5"),
        (dict(template="What is {a}?"), "template"),
        (dict(operation="-"), "operation='-'; use one of"),
    ],
)
def test_arithmetic_rejects_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        sizes = {k: kwargs.pop(k) for k in ("n_train", "n_eval") if k in kwargs}
        arithmetic_dataset(**sizes, problems=ArithmeticProblems(**kwargs))


@needs_gsm8k
def test_gsm8k_local_jsonl_becomes_chat_prompts():
    dataset = gsm8k_dataset(str(GSM8K_TRAIN), system_prompt="Solve it.", n=5)
    assert len(dataset) == 5 and set(dataset.column_names) == {"prompt", "answer"}
    first = dataset[0]
    assert first["prompt"][0] == {"role": "system", "content": "Solve it."}
    assert first["prompt"][1]["content"].startswith("Natalia sold clips")
    assert first["answer"].endswith("#### 72")


@needs_gsm8k
def test_load_spec_gsm8k_with_local_train_and_eval():
    spec = {
        "name": "gsm8k",
        "path": str(GSM8K_TRAIN),
        "eval_path": str(GSM8K_TEST),
        "train_size": 8,
        "eval_size": 4,
    }
    train, held_out = load_prompt_datasets(spec)
    assert (len(train), len(held_out)) == (8, 4)
    assert train[0]["prompt"][-1]["role"] == "user"
    assert "####" in held_out[0]["answer"]
    assert train[0]["prompt"] != held_out[0]["prompt"]


def test_load_spec_arithmetic_defaults():
    train, held_out = load_prompt_datasets({"name": "arithmetic", "train_size": 10, "seed": 3})
    assert (len(train), len(held_out)) == (10, 64)
    assert train["prompt"] == arithmetic_dataset(10, 64, seed=3)[0]["prompt"]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_load_spec_custom_jsonl_and_parquet(tmp_path):
    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(5)]
    train_path = _write_jsonl(tmp_path / "train.jsonl", rows)
    eval_path = str(tmp_path / "eval.parquet")
    Dataset.from_list(rows[:2]).to_parquet(eval_path)
    train, held_out = load_prompt_datasets(
        {"path": train_path, "eval_path": eval_path, "train_size": 3}
    )
    assert train["prompt"] == ["q0", "q1", "q2"]
    assert held_out["answer"] == ["0", "1"]
    train_only, none = load_prompt_datasets({"path": train_path})
    assert len(train_only) == 5 and none is None


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"name": "arithmetc"}, "Did you mean 'arithmetic'"),
        ({"name": "arithmetic", "train_szie": 3}, "Did you mean 'train_size'"),
        ({"name": "arithmetic", "path": "x.jsonl"}, "unknown key 'path'"),
        ({"name": "gsm8k", "path": "/no/such/file.jsonl"}, "does not exist"),
        ({"eval_path": "x.jsonl"}, "give `name`"),
        ({"name": "arithmetic", "train_size": "64"}, "must be an integer"),
        ({"name": "arithmetic", "train_size": 0}, "train_size=0 leaves no prompts to train on"),
        ({"path": "x.jsonl", "train_size": -3}, "train_size=-3 leaves no prompts"),
        ({"name": "gsm8k", "eval_size": -1}, r"eval_size=-1 must be >= 0 \(0: no held-out set\)"),
        # pyarrow's "cannot mix struct and non-struct" / "tried to convert to int64" before
        ({"name": "arithmetic", "shots": [1, 2]}, "shots must be a list of messages"),
        ({"name": "arithmetic", "system_prompt": 5}, "system_prompt must be a string, got 5"),
        ("arithmetic", "must be a mapping"),
    ],
)
def test_validate_spec_errors_say_the_fix(spec, match):
    with pytest.raises(ValueError, match=match):
        validate_dataset_spec(spec)


def test_validate_spec_checks_columns_of_local_files(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", [{"question": "q", "answer": "1"}])
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['prompt'\]"):
        validate_dataset_spec({"path": path})
    validate_dataset_spec({"name": "gsm8k", "path": path})  # gsm8k reads `question`
    parquet = str(tmp_path / "d.parquet")
    Dataset.from_dict({"text": ["x"]}).to_parquet(parquet)
    with pytest.raises(ValueError, match="lacks column"):
        validate_dataset_spec(
            {"path": _write_jsonl(tmp_path / "ok.jsonl", [{"prompt": "p"}]), "eval_path": parquet}
        )


def test_validate_spec_accepts_hub_ids_without_network(monkeypatch):
    import datasets

    def no_network(*args, **kwargs):
        raise AssertionError("validation must not load anything")

    monkeypatch.setattr(datasets, "load_dataset", no_network)
    assert validate_dataset_spec({"name": "gsm8k"}) is None
    spec = {"name": "gsm8k", "path": "openai/gsm8k", "split": "train", "eval_split": "test"}
    assert validate_dataset_spec(spec) is None
    assert dataset_hub_ids(spec) == ["openai/gsm8k"] and dataset_hub_ids({"name": "gsm8k"}) == [
        "openai/gsm8k"
    ]
    assert dataset_hub_ids({"name": "arithmetic"}) == []


def test_require_columns_names_missing_and_present():
    dataset = Dataset.from_dict({"prompt": ["p"], "solution": ["1"]})
    require_columns(dataset, ["prompt"])
    with pytest.raises(ValueError, match=r"missing column\(s\) \['answer'\].*'solution'"):
        require_columns(dataset, ["prompt", "answer"])


def test_arithmetic_multiplication_with_its_own_ranges_and_shots():
    shot = [{"role": "user", "content": "What is 2 * 3?"}, {"role": "assistant", "content": "6"}]
    problems = ArithmeticProblems(
        low=100, high=999, low_b=10, high_b=99, operation="*", shots=shot,
        system_prompt="Use the tool.",
    )  # fmt: skip
    train, held_out = arithmetic_dataset(20, 10, problems=problems)
    for row in train:
        a, b = map(
            int, row["prompt"][-1]["content"].removeprefix("What is ").rstrip("?").split(" * ")
        )
        assert 100 <= a <= 999 and 10 <= b <= 99 and row["answer"] == str(a * b)
        assert [m["role"] for m in row["prompt"]] == ["system", "user", "assistant", "user"]
    spec = {"name": "arithmetic", "operation": "*", "low_b": 1, "high_b": 9, "shots": shot}
    loaded, _ = load_prompt_datasets(spec)
    assert loaded[0]["prompt"][0]["content"] == "What is 2 * 3?"


def test_a_hub_dataset_offline_and_not_cached_is_one_line():
    # issue 45: the gsm8k recipes offline ended in a ConnectionError traceback (conftest sets
    # HF_HUB_OFFLINE and HF_DATASETS_OFFLINE)
    with pytest.raises(ValueError, match="not in the local cache and the Hub is offline") as err:
        load_prompt_datasets({"path": "nobody-xyz/no-such-dataset"})
    assert "--dataset.path TRAIN.jsonl --dataset.eval_path TEST.jsonl" in str(err.value)


def test_a_hub_dataset_without_network_is_refused_before_any_retry(monkeypatch):
    import datasets

    from grpo_plugin.models import hub_access

    def retries(*args, **kwargs):
        raise AssertionError("load_dataset would retry the Hub for half a minute")

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(datasets, "load_dataset", retries)
    monkeypatch.setattr(hub_access, "_unresolved_host", lambda: "huggingface.co")
    with pytest.raises(ValueError, match="huggingface.co does not resolve") as err:
        load_prompt_datasets({"name": "gsm8k"})
    assert "set HF_HUB_OFFLINE=1 to use a cached copy" in str(err.value)


BOM = b"\xef\xbb\xbf"


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".json"])
def test_a_file_with_a_utf8_byte_order_mark_is_read(tmp_path, suffix):
    """Issue 56: a JSONL saved with a BOM (Windows editors) was refused as invalid JSON on line 1,
    a CSV's first column read as '\\ufeffprompt'."""
    text = {
        ".jsonl": '{"prompt": "What is 1 + 1?", "answer": "2"}\n{"prompt": "2+2", "answer": "4"}\n',
        ".csv": "prompt,answer\nWhat is 1 + 1?,2\n2+2,4\n",
        ".json": '[{"prompt": "What is 1 + 1?", "answer": "2"}, {"prompt": "2+2", "answer": "4"}]',
    }[suffix]
    path = tmp_path / f"bom{suffix}"
    path.write_bytes(BOM + text.encode())
    spec = {"path": str(path), "eval_path": str(path)}
    validate_dataset_spec(spec)
    train, held_out = load_prompt_datasets(spec)
    assert train["prompt"] == ["What is 1 + 1?", "2+2"] and len(held_out) == 2
    assert [str(a) for a in train["answer"]] == ["2", "4"]


@pytest.mark.parametrize("path", ["/nonexistent", "./data/train", "../train", "a/b/c", "a\\b"])
def test_a_path_that_does_not_exist_is_named_not_looked_up_on_the_hub(monkeypatch, path):
    """Issue 56: `eval --dataset /nonexistent` said the Hub could not be reached."""
    import datasets

    def no_hub(*args, **kwargs):
        raise AssertionError("a path was looked up on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", no_hub)
    with pytest.raises(ValueError, match=r"^dataset file .* does not exist; fix the path$"):
        validate_dataset_spec({"path": path})
    with pytest.raises(ValueError, match=r"does not exist; fix the path$"):
        load_prompt_datasets({"path": "openai/gsm8k-like", "eval_path": path})


def test_a_folder_is_not_a_data_file(tmp_path):
    with pytest.raises(ValueError, match=f"dataset path '{tmp_path}' is a folder; give a .jsonl"):
        validate_dataset_spec({"path": str(tmp_path)})
