"""Min-p sampling, suppressed tokens (TRL's `min_p`, `generation_kwargs['suppress_tokens']`), and
the candidate fast path of top-k / top-p (the same tokens as the full-vocabulary path)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import MinPLogitsWarper

from grpo_plugin.rollout.sampler import (
    CANDIDATE_BUDGETS,
    filter_min_p,
    filter_top_k_top_p,
    next_tokens,
    sample_inverse_cdf,
    top_k_top_p_candidates,
)
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


# --- the candidate fast path picks exactly the reference path's tokens ---------------------------
def _previous_inverse_cdf(logits, uniforms):
    """The draw before the candidate path: normalised float64 softmax, then its running sum."""
    cdf = logits.double().softmax(dim=-1).cumsum(dim=-1)
    targets = (uniforms.double() * cdf[:, -1]).unsqueeze(-1)
    return torch.searchsorted(cdf, targets, right=True).squeeze(-1).clamp(max=logits.size(-1) - 1)


def _tied_logits(rows, vocab, seed, scale=3.0):
    """Random logits rounded to a 0.25 grid: many exact ties, also at the top-k / top-p cuts."""
    gen = torch.Generator().manual_seed(seed)
    return torch.round(torch.randn(rows, vocab, generator=gen) * scale * 4) / 4


def _logits_tied_at_the_top(rows, vocab, seed):
    """Continuous logits whose best value is shared by 3 tokens and 5th best by 2."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen) * 4
    ranked, ids = logits.topk(6, dim=-1)
    logits.scatter_(-1, ids[:, 1:3], ranked[:, :1].expand(-1, 2))
    return logits.scatter_(-1, ids[:, 5:6], ranked[:, 4:5])


@pytest.mark.parametrize("vocab", [300, 5000])
@pytest.mark.parametrize(
    "top_k, top_p, temperature",
    [
        (0, 0.9, 1.0),
        (0, 0.5, 0.7),
        (0, 0.99, 1.3),
        (1, 1.0, 1.0),
        (7, 1.0, 1.0),
        (50, 0.8, 0.9),
        (3, 0.3, 1.0),
        (400, 0.95, 1.0),
    ],
)
def test_fast_path_picks_the_reference_tokens(vocab, top_k, top_p, temperature):
    sampling = SamplingParams(
        max_new_tokens=1, top_k=top_k or None, top_p=top_p, temperature=temperature
    )
    for seed, logits in enumerate(
        [
            torch.randn(96, vocab, generator=torch.Generator().manual_seed(9)) * 4,
            _logits_tied_at_the_top(96, vocab, 1),
            _tied_logits(96, vocab, 2),
        ]
    ):
        spread = top_p == 0.99 or (vocab == 300 and top_k == 0 and top_p > 0.5)  # mass past 64
        top_tie = seed == 1 and top_k == 1  # 3 tokens share the best value: the tie passes k
        if seed < 2 and not spread and not top_tie:
            assert top_k_top_p_candidates(logits / temperature, top_k, top_p) is not None
        uniforms = torch.rand(96, generator=torch.Generator().manual_seed(seed))
        uniforms[:8] = torch.tensor([0.0, 1e-9, 0.25, 0.5, 0.75, 0.999999, 0.9999999, 0.3])
        fast = next_tokens(logits, None, sampling, uniforms)
        reference = next_tokens(logits, None, sampling, uniforms, fast=False)
        assert torch.equal(fast, reference)


def test_fast_path_is_exact_on_draws_at_the_cdf_steps():
    """Uniforms placed exactly on the reference CDF's steps (the only place two paths could part)."""
    logits = _tied_logits(1, 2000, seed=5).expand(400, -1).contiguous()
    scaled = logits / 0.8
    filtered = filter_top_k_top_p(scaled, None, 0.9)
    weights = (filtered.double() - filtered.amax(-1, keepdim=True)).exp()
    cdf = weights.cumsum(-1)[0]
    steps = (cdf[weights[0] > 0] / cdf[-1]).float()  # the CDF at every kept token
    steps = steps[steps < 1.0]  # uniforms are in [0, 1)
    uniforms = torch.cat([steps, torch.nextafter(steps, torch.ones_like(steps))])[:400]
    sampling = SamplingParams(max_new_tokens=1, top_p=0.9, temperature=0.8)
    fast = next_tokens(logits[: len(uniforms)], None, sampling, uniforms)
    reference = next_tokens(logits[: len(uniforms)], None, sampling, uniforms, fast=False)
    assert torch.equal(fast, reference)
    assert len(set(reference.tolist())) > 10  # the draws do spread over the kept tokens


def test_fast_path_is_taken_when_the_candidates_decide_and_falls_back_otherwise():
    peaked = torch.randn(4, 50_000, generator=torch.Generator().manual_seed(0)) * 4
    ids, kept = top_k_top_p_candidates(peaked, None, 0.9)
    assert ids.shape[1] in CANDIDATE_BUDGETS and torch.isfinite(kept).any(1).all()
    reference = torch.isfinite(filter_top_k_top_p(peaked, None, 0.9))
    assert reference.sum(1).tolist() == torch.isfinite(kept).sum(1).tolist()
    flat = torch.zeros(2, 50_000)
    flat[:, 0] = 1.0
    assert top_k_top_p_candidates(flat, None, 0.9) is None  # the mass is spread over 50k tokens
    tie = torch.zeros(2, 100)
    tie[:, :3] = torch.tensor([3.0, 2.0, 1.0])
    assert top_k_top_p_candidates(tie, 5, 1.0) is None  # the 5th value (0) is tied 97 times
    kept = torch.isfinite(filter_top_k_top_p(tie, 5, 1.0))
    assert kept.sum(1).tolist() == [100, 100]  # the reference keeps the whole tie, as HF does


def test_the_draw_picks_the_same_tokens_as_the_normalised_cdf():
    """Leaving the CDF unnormalised does not move any draw (checked on 20k random rows)."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(20_000, 64, generator=gen) * 3
    logits[::3, ::5] = float("-inf")  # removed tokens
    uniforms = torch.rand(20_000, generator=gen)
    assert torch.equal(
        sample_inverse_cdf(logits, uniforms), _previous_inverse_cdf(logits, uniforms)
    )


def test_cpu_running_sums_are_prefix_stable_with_exact_zeros():
    """What the exactness rests on: torch's CPU cumsum runs left to right, so a prefix gives the
    same sums alone, and interleaved zeros change nothing."""
    gen = torch.Generator().manual_seed(0)
    values = torch.rand(3, 1001, generator=gen, dtype=torch.float64)
    full = values.cumsum(-1)
    assert torch.equal(values[:, :77].cumsum(-1), full[:, :77])
    spread = torch.zeros(3, 3003, dtype=torch.float64)
    spread[:, ::3] = values
    assert torch.equal(spread.cumsum(-1)[:, ::3], full)
