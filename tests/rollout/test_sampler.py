"""Min-p sampling and suppressed tokens (TRL's `min_p`, `generation_kwargs['suppress_tokens']`)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import MinPLogitsWarper

from grpo_plugin.rollout.sampler import filter_min_p, next_tokens
from grpo_plugin.rollout.types import SamplingParams


def test_min_p_drops_tokens_below_min_p_times_the_top_probability():
    # probabilities (0.5, 0.3, 0.15, 0.05), min_p 0.2: threshold 0.2 * 0.5 = 0.1 drops only 0.05
    logits = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.15), math.log(0.05)]])
    kept = torch.isfinite(filter_min_p(logits, 0.2))
    assert kept.tolist() == [[True, True, True, False]]
    assert torch.isfinite(filter_min_p(logits, 1.0)).tolist() == [[True, False, False, False]]
    assert torch.equal(filter_min_p(logits, None), logits)


def test_min_p_matches_hf():
    scores = torch.randn(4, 50, generator=torch.Generator().manual_seed(0)) * 3
    expected = MinPLogitsWarper(0.1)(None, scores.clone())
    assert torch.equal(torch.isfinite(filter_min_p(scores, 0.1)), torch.isfinite(expected))


def test_suppressed_tokens_are_never_sampled_even_when_most_likely():
    logits = torch.tensor([[5.0, 0.0, 0.0, 0.0]]).repeat(64, 1)
    sampling = SamplingParams(max_new_tokens=1, suppress_tokens=(0, 2))
    picked = next_tokens(logits, None, sampling, torch.linspace(0.0, 0.999, 64))  # uniforms
    assert set(picked.tolist()) == {1, 3}
    greedy = SamplingParams(max_new_tokens=1, temperature=0.0, suppress_tokens=(0,))
    assert next_tokens(logits[:1], None, greedy, None).item() in (1, 2, 3)


def test_min_p_is_validated():
    with pytest.raises(ValueError, match=r"min_p must be None or in \[0, 1\]"):
        SamplingParams(max_new_tokens=1, min_p=-0.1)
