"""The high-entropy token mask (top_entropy_quantile) and the off-policy sequence mask."""

from __future__ import annotations

import pytest
import torch

from grpo_plugin.core.masks import high_entropy_mask, off_policy_mask

ENTROPIES = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.7, 0.8, 0.9, 1.0, 1.1, 1.2]])
MASK = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])  # 10 valid tokens: 0.1 .. 1.0


@pytest.mark.parametrize(
    "top, kept",
    [
        (0.2, [0.9, 1.0]),  # quantile 0.8 of 0.1..1.0 is 0.82: exactly the top 2 of 10
        (0.5, [0.6, 0.7, 0.8, 0.9, 1.0]),  # median 0.55: the top 5
        (1.0, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]),  # every valid token
        (0.0, [1.0]),  # only the highest; the padded 1.1 and 1.2 never count
    ],
)
def test_entropy_mask_keeps_exactly_the_top_quantile(top, kept):
    keep = high_entropy_mask(ENTROPIES, MASK, top)
    assert sorted(ENTROPIES[keep].tolist()) == pytest.approx(kept)
    assert not keep[1, 4:].any()


def test_entropy_mask_without_valid_tokens_is_empty():
    assert not high_entropy_mask(ENTROPIES, torch.zeros_like(MASK), 0.5).any()
    with pytest.raises(ValueError, match="top_quantile=1.5 must be in"):
        high_entropy_mask(ENTROPIES, MASK, 1.5)


def test_off_policy_mask_keeps_positive_or_close_sequences():
    logps = torch.tensor([[-2.0] * 4, [-0.5] * 4, [-2.0] * 4])
    keep = off_policy_mask(torch.tensor([1.0, -1.0, -1.0]), logps, torch.zeros(3, 4),
                           torch.ones(3, 4), threshold=1.0)  # fmt: skip
    assert keep.tolist() == [[1.0], [1.0], [0.0]]


def test_off_policy_mask_ignores_padding_values():
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    logps = torch.tensor([[-2.0, -2.0, -1e4, float("inf")]])  # padding garbage
    behaviour = torch.tensor([[0.0, 0.0, float("-inf"), float("nan")]])
    assert off_policy_mask(torch.tensor([-1.0]), logps, behaviour, mask, 1.0).item() == 0.0
    logps[0, :2] = -0.5  # mean gap over the 2 valid tokens: 0.5 <= 1
    assert off_policy_mask(torch.tensor([-1.0]), logps, behaviour, mask, 1.0).item() == 1.0


def test_entropy_mask_threshold_comes_from_the_pool_when_given():
    # Another process's tokens 2.0 and 3.0 join the pool of 12: quantile 0.5 of
    # (0.1 .. 1.0, 2.0, 3.0) is (0.6 + 0.7) / 2 = 0.65, so this process keeps 0.7 .. 1.0 only.
    pool = torch.cat([ENTROPIES[MASK.bool()], torch.tensor([2.0, 3.0])])
    keep = high_entropy_mask(ENTROPIES, MASK, 0.5, pool=pool)
    assert sorted(ENTROPIES[keep].tolist()) == pytest.approx([0.7, 0.8, 0.9, 1.0])
