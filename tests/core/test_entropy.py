"""The entropy bonus and the adaptive entropy coefficient (Skywork-OR1, as TRL)."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_plugin.core.entropy import AdaptiveEntropyCoefficient, entropy_bonus


def test_entropy_bonus_is_the_masked_mean_and_differentiable():
    entropy = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    bonus = entropy_bonus(entropy, mask)
    assert bonus.item() == pytest.approx(2.0)  # (1 + 2 + 3) / 3
    bonus.backward()
    assert entropy.grad.flatten().tolist() == pytest.approx([1 / 3, 1 / 3, 0, 1 / 3, 0, 0])
    assert entropy_bonus(torch.ones(2, 2), torch.zeros(2, 2)).item() == 0.0


def test_fixed_coefficient_is_applied_from_the_start():
    control = AdaptiveEntropyCoefficient(coef=0.01)
    assert control.enabled and control.applied() == 0.01
    assert control.end_step() is None and control.coef == 0.01
    assert not AdaptiveEntropyCoefficient(coef=0.0).enabled


def test_adaptive_coefficient_moves_towards_the_target():
    c = AdaptiveEntropyCoefficient(coef=0.0, adaptive=True, target=0.5, delta=0.1, coef_max=0.15)
    assert c.enabled and c.last_entropy == math.inf and c.applied() == 0.0  # nothing measured
    c.observe(entropy_sum=1.0, tokens=4.0)  # two micro-batches of one step: mean 3 / 10 = 0.3
    c.observe(entropy_sum=2.0, tokens=6.0)
    assert c.end_step() == pytest.approx(0.3)
    assert c.coef == pytest.approx(0.1) and c.applied() == pytest.approx(0.1)  # below target: up
    c.observe(3.0, 10.0)
    c.end_step()
    assert c.coef == pytest.approx(0.15)  # clamped at coef_max
    c.observe(9.0, 10.0)  # 0.9 > target: down, and not applied while above the target
    c.end_step()
    assert c.coef == pytest.approx(0.05) and c.applied() == 0.0
    c.observe(9.0, 10.0)
    c.end_step()
    assert c.coef == 0.0  # clamped at coef_min


def test_adaptive_step_uses_the_totals_given_instead_of_its_own_window():
    c = AdaptiveEntropyCoefficient(coef=0.1, adaptive=True, target=0.5, delta=0.1)
    c.observe(entropy_sum=1.0, tokens=10.0)  # 0.1 here: below the target
    assert c.window() == (1.0, 10.0)
    assert c.end_step(totals=(4.5, 5.0)) == pytest.approx(0.9)  # but 0.9 over every process
    assert c.coef == pytest.approx(0.0) and c.window() == (0.0, 0.0)
    assert c.end_step(totals=(0.0, 0.0)) == 0.0  # no tokens: entropy 0, as TRL
