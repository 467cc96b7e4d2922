"""The sampling correction (`core/sampling_correction.py`) on hand-derived numbers."""

import math

import pytest
import torch

from grpo_plugin.core.losses import LossInputs, policy_loss
from grpo_plugin.core.sampling_correction import CorrectionParams, sampling_weights

# Two completions of two tokens. old - sampling = [[0, 1], [0, 3]]: token ratios [[1, e], [1, e^3]],
# sequence ratios [e, e^3 = 20.09].
OLD = torch.tensor([[0.0, -1.0], [-0.5, 0.0]])
SAMPLED = torch.tensor([[0.0, -2.0], [-0.5, -3.0]])
MASK = torch.ones(2, 2)
E = math.e


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token_truncate", [[1.0, E], [1.0, 3.0]]),
        ("token_mask", [[1.0, E], [1.0, 0.0]]),
        ("sequence_truncate", [[E], [3.0]]),
        ("sequence_mask", [[E], [0.0]]),
    ],
)
def test_each_mode_bounds_the_ratio_at_clip_max_3(mode, expected):
    weights, stats = sampling_weights(OLD, SAMPLED, MASK, CorrectionParams(mode=mode))
    assert torch.allclose(weights, torch.tensor(expected), atol=1e-6)
    assert stats["sampling/sampling_logp_difference/mean"] == pytest.approx(1.0)  # (0+1+0+3)/4
    assert stats["sampling/sampling_logp_difference/max"] == pytest.approx(3.0)
    outside = 0.5 if mode.startswith("sequence") else 0.25  # one sequence of 2, one token of 4
    assert stats["sampling/importance_sampling_bounded"] == pytest.approx(outside)
    assert stats["sampling/importance_sampling_ratio/max"] == pytest.approx(max(map(max, expected)))


def test_clip_min_raises_small_ratios_and_none_bounds_leave_them():
    old, sampled = torch.tensor([[-2.0]]), torch.tensor([[-1.0]])  # ratio e^-1 = 0.368
    low = CorrectionParams(mode="token_truncate", clip_min=0.5)
    assert sampling_weights(old, sampled, torch.ones(1, 1), low)[0].item() == pytest.approx(0.5)
    free = CorrectionParams(mode="token_truncate", clip_max=None)
    assert sampling_weights(old, sampled, torch.ones(1, 1), free)[0].item() == pytest.approx(1 / E)


def test_masked_tokens_and_unknown_log_probs_do_not_count():
    old = torch.tensor([[0.0, 0.0, 0.0]])
    sampled = torch.tensor([[-1.0, float("nan"), -50.0]])  # a NaN, and a huge gap off the mask
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    weights, stats = sampling_weights(old, sampled, mask, CorrectionParams(mode="sequence_mask"))
    assert weights.item() == pytest.approx(E)  # only the first token's gap of 1
    assert stats["sampling/sampling_logp_difference/max"] == pytest.approx(1.0)


def test_no_gap_gives_weight_one_everywhere():
    weights, stats = sampling_weights(OLD, OLD.clone(), MASK, CorrectionParams(mode="token_mask"))
    assert torch.equal(weights, torch.ones(2, 2))
    assert stats["sampling/importance_sampling_bounded"] == 0.0


@pytest.mark.parametrize(
    "settings, match",
    [
        (
            {"mode": "token"},
            "sampling_correction_mode='token' is not supported; use one of token_truncate",
        ),
        ({"clip_min": 2.0, "clip_max": 1.0}, "0 <= clip_min < clip_max"),
        ({"clip_min": -1.0}, "0 <= clip_min < clip_max"),
    ],
)
def test_bad_settings_are_refused(settings, match):
    with pytest.raises(ValueError, match=match):
        CorrectionParams(**settings)


def test_policy_loss_weights_the_policy_term_and_not_the_kl():
    torch.manual_seed(0)
    logps = torch.randn(2, 3) - 2.0
    ref = logps + 0.3 * torch.randn(2, 3)
    adv, mask = torch.tensor([1.0, -0.5]), torch.ones(2, 3)
    plain, _ = policy_loss(LossInputs(logps, None, None, adv, mask), loss_type="dapo")
    doubled, _ = policy_loss(LossInputs(logps, None, None, adv, mask, sampling_weights=torch.full((2, 1), 2.0)), loss_type="dapo")  # fmt: skip
    assert doubled.item() == pytest.approx(2 * plain.item())  # on-policy: -mean(A) per token
    kl_only, _ = policy_loss(
        LossInputs(logps, None, ref, torch.zeros(2), mask), loss_type="dapo", beta=0.1
    )
    kl_weighted, _ = policy_loss(LossInputs(logps, None, ref, torch.zeros(2), mask, sampling_weights=torch.zeros(2, 3)), loss_type="dapo", beta=0.1)  # fmt: skip
    assert kl_weighted.item() == pytest.approx(kl_only.item()) and kl_only.item() > 0
