"""GDPO's normalize-then-sum advantages (TRL's multi_objective_aggregation='normalize_then_sum')."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from grpo_plugin.core.advantages import decoupled_advantages, group_advantages

NAN = float("nan")


def whiten(values):
    mean, std = statistics.fmean(values), statistics.pstdev(values)
    return [(v - mean) / (std + 1e-8) for v in values]


def test_each_reward_is_whitened_in_its_group_then_the_sum_over_the_batch():
    # f1 = (1, 0, 0) -> (sqrt 2, -1/sqrt 2, -1/sqrt 2); f2 = (0, 10, 20) -> (-sqrt 1.5, 0, sqrt 1.5):
    # the scale of f2 (x10) does not matter. Weighted sum (1, 2), then whitened over the batch.
    per_func = torch.tensor([[[1.0, 0.0], [0.0, 10.0], [0.0, 20.0]]], dtype=torch.float64)
    r2, r15 = math.sqrt(2), math.sqrt(1.5)
    summed = [r2 - 2 * r15, -1 / r2, -1 / r2 + 2 * r15]
    adv = decoupled_advantages(per_func, torch.tensor([1.0, 2.0]))
    assert adv[0].tolist() == pytest.approx(whiten(summed), abs=1e-7)
    scaled = per_func.clone()
    scaled[..., 1] *= 1000
    assert torch.allclose(decoupled_advantages(scaled, torch.tensor([1.0, 2.0])), adv)


def test_unscored_completions_get_zero_and_count_as_zero_in_the_sum():
    per_func = torch.tensor(
        [[[1.0, NAN], [0.0, NAN], [NAN, NAN]], [[2.0, 1.0], [2.0, 3.0], [2.0, 5.0]]]
    )
    adv = decoupled_advantages(per_func, torch.tensor([1.0, 1.0]))
    assert adv[0, 2].item() == 0.0  # no function scored it
    # group 0: f1 -> (1, -1), f2 all NaN -> 0; group 1: f1 uniform -> 0, f2 -> (-r, 0, r)
    r = math.sqrt(1.5)
    expected = whiten([1.0, -1.0, -r, 0.0, r])  # the 5 scored completions
    got = [adv[0, 0], adv[0, 1], adv[1, 0], adv[1, 1], adv[1, 2]]
    assert [x.item() for x in got] == pytest.approx(expected, abs=1e-6)


def test_one_function_normalize_then_sum_is_batch_whitened_group_advantages():
    rewards = torch.tensor([[1.0, 0.0, 0.0], [3.0, 1.0, 2.0]], dtype=torch.float64)
    adv = decoupled_advantages(rewards.unsqueeze(-1), torch.tensor([1.0]))
    batch = group_advantages(group_advantages(rewards).reshape(1, -1)).reshape(2, 3)
    assert torch.allclose(adv, batch)
    with pytest.raises(ValueError, match=r"shape \(P, G, F\) with F = len\(weights\) = 2"):
        decoupled_advantages(rewards.unsqueeze(-1), torch.tensor([1.0, 1.0]))
