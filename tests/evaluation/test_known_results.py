"""grpo_plugin/evaluation/known_results.py: what names an evaluation's result, and its store."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from conftest import make_tiny_model, tiny_lora
from datasets import Dataset

import reward_fns
from grpo_plugin.evaluation import known_results as known
from grpo_plugin.evaluation.evaluator import EvalSettings


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv(known.ENV, str(tmp_path / "evaluations"))
    return tmp_path / "evaluations"


def rows(n: int = 3) -> Dataset:
    prompts = [[{"role": "user", "content": f"What is {i} + 1?"}] for i in range(n)]
    return Dataset.from_dict({"prompt": prompts, "answer": [str(i + 1) for i in range(n)]})


def with_lora(model, seed: int):
    from peft import get_peft_model

    torch.manual_seed(seed)
    return get_peft_model(copy.deepcopy(model), tiny_lora())


def test_the_weights_name_the_result_and_an_identity_adapter_does_not(tiny_tokenizer):
    base = make_tiny_model(tiny_tokenizer)
    assert known.weights_fingerprint(base) == known.weights_fingerprint(copy.deepcopy(base))
    # two seeds draw different lora_A; with every lora_B zero both add exactly nothing
    a, b = with_lora(base, seed=1), with_lora(base, seed=2)
    assert known.weights_fingerprint(a) == known.weights_fingerprint(b)
    changed = copy.deepcopy(base)
    with torch.no_grad():
        next(changed.parameters()).view(-1)[0] += 1e-3
    assert known.weights_fingerprint(changed) != known.weights_fingerprint(base)
    trained = with_lora(base, seed=1)
    with torch.no_grad():
        next(p for n, p in trained.named_parameters() if ".lora_B." in n).view(-1)[0] = 0.5
    assert known.weights_fingerprint(trained) != known.weights_fingerprint(a)


def test_a_shipped_reward_and_its_parameters_are_known_a_users_is_not():
    plain = known.reward_identity(reward_fns.get("last_integer"))
    assert plain == {"module": "reward_fns.answers", "name": "last_integer", "bound": {}}
    timed = known.reward_identity(reward_fns.get("code_tests", timeout_s=2.0))
    assert timed["bound"] == {"timeout_s": 2.0} and timed["module"] == "reward_fns.code"

    def users_reward(completions, **kwargs):
        return [1.0 for _ in completions]

    assert known.reward_identity(users_reward) is None
    assert known.reward_identity(reward_fns.configure(users_reward, name="x", scale=1)) is None


def test_the_key_changes_with_each_input_it_names(tiny_tokenizer):
    model = make_tiny_model(tiny_tokenizer)
    reward = reward_fns.get("last_integer")
    settings = EvalSettings.from_options({"k": 0, "max_new_tokens": 4})
    key = known.evaluation_key(model, tiny_tokenizer, rows(), reward, settings)
    assert key == known.evaluation_key(model, tiny_tokenizer, rows(), reward, settings)
    others = [
        (model, rows(4), reward, settings),
        (model, rows(), reward_fns.get("exact_integer"), settings),
        (model, rows(), reward, EvalSettings.from_options({"k": 0, "max_new_tokens": 5})),
        (make_tiny_model(tiny_tokenizer, seed=3), rows(), reward, settings),
    ]
    greedy_other_seed = EvalSettings.from_options({"k": 0, "max_new_tokens": 4, "seed": 7})
    assert known.evaluation_key(model, tiny_tokenizer, rows(), reward, greedy_other_seed) == key
    sampled = [EvalSettings.from_options({"k": 2, "max_new_tokens": 4, "seed": s}) for s in (0, 7)]
    a, b = (known.evaluation_key(model, tiny_tokenizer, rows(), reward, s) for s in sampled)
    assert a != b and key not in (a, b)  # samples depend on the seed
    keys = {known.evaluation_key(m, tiny_tokenizer, d, r, s) for m, d, r, s in others}
    assert len(keys) == 4 and key not in keys
    torch.set_num_threads(2 if torch.get_num_threads() == 1 else 1)  # conftest restores it
    assert known.evaluation_key(model, tiny_tokenizer, rows(), reward, settings) != key


def test_store_round_trip_and_what_it_refuses(store):
    assert known.known_result("k1") is None
    known.remember("k1", {"accuracy": 0.25, "n": 4})
    assert known.known_result("k1") == {"accuracy": 0.25, "n": 4}
    assert not list(store.glob("*.tmp"))  # written beside, renamed into place
    (store / "bad.json").write_text("{not json")
    (store / "odd.json").write_text(json.dumps({"result": {"n": 1}}))  # no accuracy
    assert known.known_result("bad") is None and known.known_result("odd") is None


def test_off_stores_and_finds_nothing(store, monkeypatch):
    known.remember("k1", {"accuracy": 1.0})
    monkeypatch.setenv(known.ENV, "off")
    assert known.store_dir() is None and known.known_result("k1") is None
    known.remember("k2", {"accuracy": 1.0})
    assert not (store / "k2.json").exists()
