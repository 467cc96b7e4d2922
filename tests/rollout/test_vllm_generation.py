"""`generate_groups` through the vLLM engine, with a stand-in engine (no vLLM): the request
becomes vLLM's sampling fields and per-prompt seeds, and its samples become the same
`RolloutBatch` our own loop returns."""

from __future__ import annotations

import pytest
import torch

from grpo_plugin.engine.vllm_engine import Sample, VllmEngine, VllmSettings
from grpo_plugin.rollout.generation import generate_groups
from grpo_plugin.rollout.noise import KeyedNoise, RolloutKey
from grpo_plugin.rollout.types import GenerationRequest, SamplingParams
from grpo_plugin.rollout.vllm_generation import SEED_SPAN, prompt_seeds, vllm_sampling


class ScriptedEngine(VllmEngine):
    """Returns canned samples and records what it was asked."""

    def __init__(self, samples: list[list[Sample]]) -> None:
        super().__init__(VllmSettings("float32", 64, 4, seed=0, row_tokens=16))
        self.samples, self.asked = samples, []

    def generate(self, prompts, sampling, seeds):
        self.asked.append((prompts, sampling, seeds))
        return self.samples


def _request(noise=None, **sampling) -> GenerationRequest:
    params = SamplingParams(max_new_tokens=3, **sampling)
    return GenerationRequest(params, num_generations=2, eos_token_ids=(9, 8), pad_token_id=0,
                             noise=noise, record_logprobs=True)  # fmt: skip


def test_vllms_samples_become_the_rollout_batch_our_loop_returns():
    samples = [
        [Sample([5, 9], [-0.5, -0.25], True), Sample([6, 6, 6], [-1.0, -2.0, -3.0], False)],
        [Sample([8], [-0.125], True), Sample([7, 8], [-1.5, -0.5], True)],
    ]
    engine = ScriptedEngine(samples)
    batch = generate_groups(engine, [[1, 2, 3], [4]], _request())
    assert batch.prompt_ids.tolist() == [[1, 2, 3], [1, 2, 3], [0, 0, 4], [0, 0, 4]]
    assert batch.prompt_mask.tolist() == [[1, 1, 1]] * 2 + [[0, 0, 1]] * 2
    assert batch.completion_ids.tolist() == [[5, 9, 0], [6, 6, 6], [8, 0, 0], [7, 8, 0]]
    assert batch.completion_mask.tolist() == [[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]]
    assert batch.is_truncated.tolist() == [False, True, False, False]
    assert batch.num_generated_tokens == 8 and batch.num_prefill_tokens == 8
    expected = [[-0.5, -0.25, 0], [-1, -2, -3], [-0.125, 0, 0], [-1.5, -0.5, 0]]
    assert batch.sampling_logps.tolist() == expected


def test_the_request_becomes_vllms_sampling_fields():
    request = _request(temperature=0.7, top_p=0.9, top_k=None, min_p=None, repetition_penalty=1.1)
    assert vllm_sampling(request) == {
        "n": 2, "temperature": 0.7, "top_p": 0.9, "top_k": 0, "min_p": 0.0,
        "repetition_penalty": 1.1, "max_tokens": 3, "stop_token_ids": [9, 8], "logprobs": 0,
    }  # fmt: skip


def test_each_prompt_is_seeded_by_its_keyed_draws_whatever_the_batch():
    key = RolloutKey(seed=3, rollout=5)
    both = KeyedNoise.for_prompts(key, [0, 1], group_size=2, max_new_tokens=3)
    second = KeyedNoise.for_prompts(key, [1], group_size=2, max_new_tokens=3)
    seeds = prompt_seeds(_request(both), 2)
    assert prompt_seeds(_request(second), 1) == seeds[1:]  # prompt 1's seed, alone or not
    assert seeds[0] != seeds[1] and all(s % 2 == 0 for s in seeds)  # spaced G = 2 apart
    assert seeds[0] == int(float(both.table[0, 0].double()) * SEED_SPAN) * 2
    other_rollout = KeyedNoise.for_prompts(RolloutKey(3, 6), [0, 1], 2, 3)
    assert prompt_seeds(_request(other_rollout), 2) != seeds


def test_a_request_without_keyed_draws_is_seeded_from_its_generator():
    request = _request()
    gen = lambda: torch.Generator().manual_seed(1)  # noqa: E731
    a = prompt_seeds(GenerationRequest(**{**request.__dict__, "generator": gen()}), 3)
    b = prompt_seeds(GenerationRequest(**{**request.__dict__, "generator": gen()}), 3)
    assert a == b and len(set(a)) == 3


def test_a_prompt_the_engine_cannot_hold_is_refused_in_one_line():
    engine = ScriptedEngine([])  # max_model_len 64, max_new_tokens 3: room for 61 prompt tokens
    with pytest.raises(
        ValueError, match=r"^prompt 1 of this batch has 62 tokens, .* holds 61: set"
    ):
        generate_groups(engine, [[1] * 61, [1] * 62], _request())
    assert engine.asked == []  # refused before vLLM was asked anything
