"""pass@k against hand-derived values; evaluate() on a tiny random model with scripted rewards."""

from __future__ import annotations

import math

import pytest
import torch
from datasets import Dataset

import reward_fns
from grpo_plugin.evaluation.evaluator import EvalSettings, evaluate, pass_at_k
from grpo_plugin.rollout.types import SamplingParams


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (10, 0, 1, 0.0),
        (10, 3, 1, 0.3),  # pass@1 = c / n
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (8, 2, 8, 1.0),  # every sample drawn
        (6, 5, 2, 1.0),  # n - c < k: a correct one is always drawn
        (10, 1, 5, 0.5),  # 1 - C(9,5)/C(10,5) = 1 - 126/252
    ],
)
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_binomial_formula_for_large_n():
    n, c, k = 200, 17, 50
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, 1, 0), (4, 1, 5), (4, -1, 1)])
def test_pass_at_k_rejects_bad_arguments(n, c, k):
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(n, c, k)


def _chat_dataset(n=3):
    return Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": f"What is {i} + 1?"}] for i in range(n)],
            "answer": [str(i + 1) for i in range(n)],
        }
    )


def _settings(max_new_tokens: int, **fields) -> EvalSettings:
    return EvalSettings(SamplingParams(max_new_tokens=max_new_tokens), **fields)


class RecordingReward:
    """Rewards 1.0 for the prompts whose answer is in `good`, None for those in `none`."""

    runs_in_process = True  # it records its calls into this process's memory

    def __init__(self, good=(), none=()):
        self.good, self.none, self.calls = set(good), set(none), []

    def __call__(self, prompts, completions, completion_ids, answer, **kwargs):
        self.calls.append(
            dict(prompts=prompts, completions=completions, ids=completion_ids, answer=answer)
        )
        return [None if a in self.none else float(a in self.good) for a in answer]


def test_evaluate_greedy_accuracy_and_reward_contract(tiny_model, tiny_tokenizer):
    reward = RecordingReward(good={"1", "2"}, none={"3"})
    tiny_model.train()
    greedy_only = _settings(5, num_samples=0, batch_size=3)
    result = evaluate(tiny_model, tiny_tokenizer, _chat_dataset(4), reward, greedy_only)
    assert result["n"] == 4 and not any(key.startswith("pass@") for key in result)
    assert result["accuracy"] == pytest.approx(0.5)  # "1","2" right; "3" None -> wrong; "4" wrong
    assert result["mean_reward"] == pytest.approx(0.5)
    assert tiny_model.training, "evaluate must restore train mode"
    assert [len(c["answer"]) for c in reward.calls] == [3, 1]  # batch_size bounds each call
    call = reward.calls[0]
    assert call["completions"][0][0]["role"] == "assistant"
    assert isinstance(call["completions"][0][0]["content"], str)
    assert all(1 <= len(ids) <= 5 for ids in call["ids"])
    assert call["prompts"][0][0]["content"] == "What is 0 + 1?"


def test_evaluate_pass_at_k_counts_samples_per_prompt(tiny_model, tiny_tokenizer):
    reward = RecordingReward(good={"1"})
    settings = _settings(3, num_samples=4, pass_k=2, batch_size=8)
    result = evaluate(tiny_model, tiny_tokenizer, _chat_dataset(2), reward, settings)
    # prompt "1": all 4 samples right -> 1; prompt "2": none right -> 0
    assert result["pass@2"] == pytest.approx(0.5)
    assert result["pass@1"] == pytest.approx((4 / 4 + 0 / 4) / 2)  # the samples' share right
    assert result["num_samples"] == 4 and result["k"] == 2
    sampled = reward.calls[-1]
    assert sampled["answer"] == ["1"] * 4 + ["2"] * 4
    assert not tiny_model.training


def test_evaluate_string_prompts_get_string_completions(tiny_model, tiny_tokenizer):
    dataset = Dataset.from_dict({"prompt": ["1+1=", "2+2="], "answer": ["2", "4"]})
    seen = []

    @reward_fns.in_process  # it records into this process's memory
    def reward(prompts, completions, completion_ids, answer, **kw):
        seen.extend(completions)
        return [1.0, 0.0]

    result = evaluate(tiny_model, tiny_tokenizer, dataset, reward, _settings(4, num_samples=0))
    assert result["accuracy"] == pytest.approx(0.5)
    assert all(isinstance(c, str) for c in seen)


def test_sampling_is_seeded_and_leaves_global_rng_alone(tiny_model, tiny_tokenizer):
    sampled_ids = []

    @reward_fns.in_process  # it records into this process's memory
    def reward(prompts, completions, completion_ids, **kw):
        sampled_ids.append(completion_ids)
        return [0.0] * len(completion_ids)

    def run(seed):
        settings = _settings(6, num_samples=2, seed=seed)
        evaluate(tiny_model, tiny_tokenizer, _chat_dataset(2), reward, settings)
        return sampled_ids[-1]

    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    first = run(seed=0)
    assert torch.rand(1) == before, "evaluate must not advance the global RNG"
    assert run(seed=0) == first
    assert run(seed=1) != first


def test_greedy_completions_match_hf_generate(tiny_model, tiny_tokenizer):
    """Greedy eval runs on our prefix-shared sampler; it must agree with HF's greedy decoding."""
    dataset = Dataset.from_dict({"prompt": ["a", "abc+1="], "answer": ["x", "y"]})
    seen = []

    @reward_fns.in_process  # it records into this process's memory
    def reward(prompts, completions, completion_ids, **kw):
        seen.extend(completion_ids)
        return [0.0] * len(completions)

    evaluate(tiny_model, tiny_tokenizer, dataset, reward, _settings(6, num_samples=0))
    eos = tiny_tokenizer.eos_token_id
    for prompt, ids in zip(dataset["prompt"], seen):
        inputs = tiny_tokenizer(prompt, return_tensors="pt")
        out = tiny_model.generate(
            **inputs, max_new_tokens=6, do_sample=False, eos_token_id=eos, pad_token_id=0
        )[0, inputs["input_ids"].shape[1] :].tolist()
        expected = out[: out.index(eos) + 1] if eos in out else out
        assert ids == expected


def test_evaluate_rejects_missing_prompt_column(tiny_model, tiny_tokenizer):
    with pytest.raises(ValueError, match="'prompt' column"):
        evaluate(tiny_model, tiny_tokenizer, Dataset.from_dict({"q": ["x"]}), RecordingReward())
    with pytest.raises(ValueError, match="empty dataset"):
        evaluate(tiny_model, tiny_tokenizer, _chat_dataset(0), RecordingReward())


def test_samples_do_not_depend_on_the_batch_size(tiny_model, tiny_tokenizer):
    """pass@k samples are keyed on (seed, prompt index): batching (or sharding) changes nothing."""
    calls = {}

    @reward_fns.in_process  # it records into this process's memory
    def reward(prompts, completions, completion_ids, **kw):
        calls.setdefault(run_batch, []).append(completion_ids)
        return [0.0] * len(completion_ids)

    for run_batch in (2, 4, 16):  # 1, 2 and all 5 prompts per generation call
        settings = _settings(6, num_samples=2, batch_size=run_batch)
        evaluate(tiny_model, tiny_tokenizer, _chat_dataset(5), reward, settings)
    # per chunk: the greedy call, then the sampled one
    sampled = {b: [ids for call in c[1::2] for ids in call] for b, c in calls.items()}
    assert [len(c) for c in calls.values()] == [10, 6, 2]  # 5, 3 and 1 chunks
    greedy = 0
    assert len(sampled[16]) == 10
    assert sampled[2][greedy:] == sampled[4][greedy:] == sampled[16][greedy:]
    assert len(set(map(tuple, sampled[16][greedy:]))) > 1  # real samples, not all identical


@pytest.mark.parametrize(
    ("options", "expected"),
    [  # issue 45: k=-3 failed mid-evaluation as a negative tensor dimension
        ({"k": -3}, "k=-3 must be an integer >= 0"),
        ({"k": 4, "num_samples": 2}, "num_samples=2 must be >= k=4"),
        ({"max_new_tokens": 0}, "max_new_tokens=0 must be an integer >= 1"),
        ({"batch_size": 0}, "batch_size=0 must be an integer >= 1"),
        ({"temperature": float("nan")}, "temperature=nan must be a finite number >= 0"),
        ({"success_threshold": float("inf")}, "success_threshold=inf must be a finite number"),
        ({"top_p": 0.9}, r"unknown evaluation option\(s\) \['top_p'\]"),
    ],
)
def test_flat_options_are_refused_before_anything_is_generated(options, expected):
    with pytest.raises(ValueError, match=expected):
        EvalSettings.from_options(options)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"pass_k": -3}, "pass_k=-3 must be an integer >= 0"),
        ({"pass_k": 4, "num_samples": 2}, "num_samples=2 must be >= pass_k=4"),
        ({"pass_k": 2, "num_samples": 0}, "pass_k=2 needs num_samples >= 2"),
        ({"batch_size": 0}, "batch_size=0 must be an integer >= 1"),
        ({"success_threshold": float("nan")}, "success_threshold=nan must be a finite number"),
    ],
)
def test_settings_are_checked_where_they_are_stored(fields, expected):
    with pytest.raises(ValueError, match=expected):
        EvalSettings(**fields)


def test_flat_options_map_onto_the_settings():
    assert EvalSettings.from_options({}) == EvalSettings(pass_k=8)  # pass@8, 64 tokens, T=1
    assert EvalSettings().num_samples == 8 and EvalSettings().sampling.max_new_tokens == 64
    greedy = EvalSettings.from_options({"k": 0, "max_new_tokens": 5, "seed": 3})
    assert (greedy.num_samples, greedy.pass_k, greedy.seed) == (0, None, 3)
    assert greedy.sampling == SamplingParams(max_new_tokens=5, temperature=1.0)
    sampled = EvalSettings.from_options({"k": 2, "num_samples": 4, "temperature": 0.5})
    assert (sampled.num_samples, sampled.pass_k, sampled.sampling.temperature) == (4, 2, 0.5)
    assert EvalSettings.from_options({"k": 3}).num_samples == 3  # num_samples defaults to k


def test_what_a_reward_logs_is_in_the_result_averaged_over_its_completions(
    tiny_model, tiny_tokenizer
):
    """`log_metric` reaches a reward outside a training run too (code_tests' outcomes);
    `trainer_state` is None there, and a key of the result's own wins a clash."""
    seen_states = []

    def reward(prompts, completions, answer, log_metric, trainer_state, **kwargs):
        seen_states.append(trainer_state)
        for a in answer:
            log_metric("outcome/r/one", float(a == "1"))
            log_metric("accuracy", 7.0)
        return [float(a == "1") for a in answer]

    reward.runs_in_process = True  # it records into this process's list
    result = evaluate(
        tiny_model, tiny_tokenizer, _chat_dataset(4), reward, _settings(3, num_samples=0)
    )
    assert result["outcome/r/one"] == pytest.approx(1 / 4)
    assert result["accuracy"] == pytest.approx(1 / 4) and set(seen_states) == {None}
