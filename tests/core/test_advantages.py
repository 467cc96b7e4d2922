"""Group-relative advantages (DeepSeekMath, RLOO, Dr. GRPO, batch std) with hand-derived values,
and GDPO's normalize-then-sum advantages (TRL's multi_objective_aggregation='normalize_then_sum')."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch

from grpo_plugin.core.advantages import decoupled_advantages, group_advantages
from grpo_plugin.core.objectives import ESTIMATORS

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


R2 = math.sqrt(2)  # (1, 0, 0): mean 1/3, population std sqrt(2)/3 -> (sqrt 2, -1/sqrt 2, -1/sqrt 2)


def t64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def zeros(*shape: int) -> torch.Tensor:
    return torch.zeros(*shape, dtype=torch.float64)


# ----------------------------------------------------------------------------- advantages


def test_grpo_advantages_of_one_correct_answer_in_three():
    adv = group_advantages(t64([[1.0, 0.0, 0.0]]))
    assert torch.allclose(adv, t64([[R2, -1 / R2, -1 / R2]]), atol=1e-7)
    assert torch.allclose(adv, t64([[1.4142, -0.7071, -0.7071]]), atol=1e-4)


def test_uniform_group_gives_exact_zeros():
    for estimator in ESTIMATORS:
        adv = group_advantages(t64([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]), estimator=estimator)
        assert torch.equal(adv, zeros(2, 3)), estimator


def test_rloo_and_dr_grpo_advantages():
    rewards = t64([[1.0, 0.0, 0.0]])
    assert torch.allclose(group_advantages(rewards, "rloo"), t64([[1.0, -0.5, -0.5]]))
    assert torch.allclose(group_advantages(rewards, "dr_grpo"), t64([[2 / 3, -1 / 3, -1 / 3]]))


def test_batch_estimator_uses_batch_std_and_group_mean():
    # batch mean 2/3, batch variance (4 * 1/9 + 2 * 4/9) / 6 = 2/9 -> std sqrt(2)/3
    adv = group_advantages(t64([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]), "batch")
    assert torch.allclose(adv, t64([[R2, -1 / R2, -1 / R2], [0.0, 0.0, 0.0]]), atol=1e-7)
    assert torch.equal(group_advantages(t64([[2.0, 2.0], [2.0, 2.0]]), "batch"), zeros(2, 2))


def test_std_at_or_below_eps_gives_zero():
    rewards = t64([[0.0, 0.1]])  # population std 0.05
    assert torch.equal(group_advantages(rewards, eps=0.05), zeros(1, 2))
    assert torch.allclose(group_advantages(rewards, eps=0.04), t64([[-0.05 / 0.09, 0.05 / 0.09]]))
    assert torch.equal(group_advantages(rewards, "batch", eps=0.05), zeros(1, 2))


def test_nan_rewards_are_left_out_and_get_zero():
    rewards = t64([[1.0, NAN, 0.0, 0.0], [1.0, NAN, NAN, NAN], [NAN] * 4])
    grpo = group_advantages(rewards)
    assert torch.allclose(grpo[0], t64([R2, 0.0, -1 / R2, -1 / R2]), atol=1e-7)
    assert torch.equal(grpo[1:], zeros(2, 4))
    rloo = group_advantages(rewards, "rloo")
    assert torch.allclose(rloo[0], t64([1.0, 0.0, -0.5, -0.5]))
    assert torch.equal(rloo[1:], zeros(2, 4))
    for estimator in ESTIMATORS:
        assert not torch.isnan(group_advantages(rewards, estimator)).any(), estimator


def test_batch_estimator_ignores_nan_and_short_rows():
    # scored rewards 1, 0, 0 (row 0) and 5 (row 1, alone -> zeros): batch std over {1, 0, 0, 5}
    rewards = t64([[1.0, 0.0, 0.0], [5.0, NAN, NAN]])
    std = np.std([1.0, 0.0, 0.0, 5.0])
    adv = group_advantages(rewards, "batch")
    assert torch.allclose(adv[0], t64([2 / 3, -1 / 3, -1 / 3]) / (std + 1e-8))
    assert torch.equal(adv[1], zeros(3))


def test_advantages_keep_float32_and_accept_ints():
    adv32 = group_advantages(torch.tensor([[1.0, 0.0]], dtype=torch.float32))
    assert adv32.dtype == torch.float32
    assert torch.allclose(adv32, torch.tensor([[1.0, -1.0]]), atol=1e-6)
    assert group_advantages(torch.tensor([[1, 0]])).dtype == torch.get_default_dtype()


def test_advantage_errors():
    allowed = "'grpo', 'dr_grpo', 'rloo', 'batch'"
    with pytest.raises(ValueError, match=f"estimator must be one of {allowed}"):
        group_advantages(t64([[1.0, 0.0]]), "ppo")
    with pytest.raises(ValueError, match="rloo.*at least 2"):
        group_advantages(t64([[1.0], [0.0]]), "rloo")
    with pytest.raises(ValueError, match="rewards must be 2-D"):
        group_advantages(t64([1.0, 0.0]))
