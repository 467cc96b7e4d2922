"""Keyed sampling noise: a prompt's draws depend on (seed, rollout, round, global prompt index) only."""

from __future__ import annotations

import torch

from grpo_plugin.rollout.generation import generate_groups
from grpo_plugin.rollout.noise import KeyedNoise, RolloutKey, keyed_generator
from grpo_plugin.rollout.types import GenerationRequest, SamplingParams

KEY = RolloutKey(seed=0, rollout=3)


def test_a_shard_gets_the_draws_of_the_whole_batch():
    whole = KeyedNoise.for_prompts(KEY, range(4), group_size=3, max_new_tokens=5).table
    shard = KeyedNoise.for_prompts(KEY, [2, 3], group_size=3, max_new_tokens=5).table
    assert whole.shape == (12, 5) and shard.shape == (6, 5)
    assert torch.equal(whole[6:], shard)  # prompts 2 and 3 are rows 6..11 of the whole batch


def test_draws_change_with_every_part_of_the_key_and_not_with_max_new_tokens():
    def table(key, prompts=(0,), tokens=6):
        return KeyedNoise.for_prompts(key, prompts, group_size=2, max_new_tokens=tokens).table

    base = table(KEY)
    assert torch.equal(base, table(RolloutKey(0, 3)))
    for other in (RolloutKey(1, 3), RolloutKey(0, 4), RolloutKey(0, 3, round=1)):
        assert not torch.equal(base, table(other))
    assert not torch.equal(base, table(KEY, prompts=(1,)))
    assert not torch.equal(base[0], base[1])  # the G rows of a group draw differently
    assert torch.equal(table(KEY, tokens=10)[:, :6], base)  # longer completions extend the stream


def test_keyed_generator_is_stable():
    first = torch.rand(3, generator=keyed_generator("shuffle", 0, 1, 0))
    again = torch.rand(3, generator=keyed_generator("shuffle", 0, 1, 0))
    other = torch.rand(3, generator=keyed_generator("refill", 0, 1, 0))
    assert torch.equal(first, again) and not torch.equal(first, other)


def test_completions_do_not_depend_on_the_other_prompts_in_the_batch(tiny_tokenizer, tiny_model):
    """Prompt 1 sampled alongside prompt 0 (whose rows finish and leave the batch at other
    steps) or alone, as a shard holding only global prompt 1, gets the same completions."""
    prompts = [tiny_tokenizer("12+3=")["input_ids"], tiny_tokenizer("45*6=")["input_ids"]]
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0)
    # make a frequent token act as EOS so rows finish early and are dropped from the batch
    probe = generate_groups(tiny_model, prompts, GenerationRequest(
        sampling, num_generations=4, eos_token_ids=[2], pad_token_id=0,
        noise=KeyedNoise.for_prompts(KEY, [0, 1], 4, 12),
    ))  # fmt: skip
    eos = int(probe.completion_ids[0, 2])

    def run(prompt_ids, indices):
        noise = KeyedNoise.for_prompts(KEY, indices, 4, 12)
        return generate_groups(tiny_model, prompt_ids, GenerationRequest(
            sampling, num_generations=4, eos_token_ids=[2, eos], pad_token_id=0, noise=noise,
        ))  # fmt: skip

    both, alone = run(prompts, [0, 1]), run(prompts[1:], [1])
    assert not both.is_truncated.all()  # some rows did finish early
    width = alone.completion_ids.shape[1]
    assert torch.equal(both.completion_ids[4:, :width], alone.completion_ids)
    assert torch.equal(both.completion_mask[4:, :width], alone.completion_mask)
    assert int(both.completion_mask[4:, width:].sum()) == 0
