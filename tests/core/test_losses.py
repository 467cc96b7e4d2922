"""k3, the KL estimator of DeepSeekMath eq. 4 (`core/losses.kl_k3`): non-negative, zero on
equality, and its Monte-Carlo mean equals the categorical KL."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_plugin.core.objectives import kl_k3


def t64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


# ----------------------------------------------------------------------------- k3


def test_k3_is_non_negative_and_zero_on_equality():
    gen = torch.Generator().manual_seed(0)
    logps = -torch.rand(1000, generator=gen, dtype=torch.float64) * 20
    ref = -torch.rand(1000, generator=gen, dtype=torch.float64) * 20
    assert (kl_k3(logps, ref) >= 0).all()
    nearly_equal = (logps + 1e-7 * torch.randn(1000, generator=gen, dtype=torch.float64)).float()
    assert (kl_k3(logps.float(), nearly_equal) >= 0).all()  # no rounding below zero in float32
    assert torch.equal(kl_k3(logps, logps), torch.zeros_like(logps))
    # d = ref - logp = log 2: 2 - log 2 - 1
    assert kl_k3(t64([0.0]), t64([math.log(2)])).item() == pytest.approx(1 - math.log(2), abs=1e-12)


def test_k3_monte_carlo_mean_matches_categorical_kl():
    """E_{y~pi}[k3] = KL(pi || pi_ref), since E_pi[pi_ref/pi] = 1."""
    gen = torch.Generator().manual_seed(1)
    log_pi = torch.log_softmax(torch.randn(6, generator=gen, dtype=torch.float64), dim=0)
    log_ref = torch.log_softmax(torch.randn(6, generator=gen, dtype=torch.float64), dim=0)
    exact_kl = (log_pi.exp() * (log_pi - log_ref)).sum().item()
    k3_per_answer = kl_k3(log_pi, log_ref)  # (6,)
    assert (log_pi.exp() * k3_per_answer).sum().item() == pytest.approx(exact_kl, abs=1e-12)
    samples = torch.multinomial(log_pi.exp(), 200_000, replacement=True, generator=gen)
    k3 = k3_per_answer[samples]
    std_error = k3.std().item() / math.sqrt(len(samples))
    assert abs(k3.mean().item() - exact_kl) < 4 * std_error
    assert std_error < 0.05 * exact_kl  # the check is tight relative to the KL itself


def test_k3_shape_mismatch():
    with pytest.raises(ValueError, match="same shape"):
        kl_k3(torch.zeros(2, 3), torch.zeros(3, 2))
