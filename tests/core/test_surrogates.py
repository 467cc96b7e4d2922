"""The loss types TRL 1.16 adds to GRPO (bnpo, cispo, sapo, luspo, vespo), two-sided clipping
(`delta`), the ratio-corrected KL and the off-policy mask: each loss and gradient against values
derived by hand in the comments."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_plugin.core.objectives import LossInputs, policy_loss
from grpo_plugin.core.surrogates import vespo_gamma_weights


def t64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def loss_and_grad(logps, old, adv, mask=None, ref=None, **settings):
    """(loss, dloss/dlogps, stats) of `policy_loss` in float64."""
    logps = t64(logps).requires_grad_()
    mask = torch.ones_like(logps) if mask is None else t64(mask)
    old = None if old is None else t64(old)
    ref = None if ref is None else t64(ref)
    loss, stats = policy_loss(LossInputs(logps, old, ref, t64(adv), mask), **settings)
    loss.backward()
    return loss.item(), logps.grad, stats


def with_ratios(logps, ratios):
    """Behaviour log-probs that give each token the importance ratio `ratios`."""
    return [[lp - math.log(r) for lp, r in zip(row, rrow)] for row, rrow in zip(logps, ratios)]


@pytest.mark.parametrize(
    "loss_type, kwargs, w_short, w_long",
    [
        ("bnpo", {}, 1 / 8, 1 / 8),  # token mean over the (local) batch: 1 / 8 tokens
        ("luspo", {}, 1 / 2, 1 / 2),  # each sequence's SUM, mean over N = 2 sequences
        ("sapo", {}, 1 / 4, 1 / 12),  # at rho = 1 the gate's slope is 4 * 1/4 = 1: grpo's weights
        ("cispo", {"epsilon_high": 5.0}, 1 / 8, 1 / 8),  # weight min(1, 5) = 1, token mean
        ("cispo", {}, 0.2 / 8, 0.2 / 8),  # TRL: eps_max defaults to epsilon = 0.2
        ("vespo", {}, 1 / 8, 1 / 8),  # phi(1) = e^lambda * 1 * e^-lambda = 1, token mean
    ],
)
def test_on_policy_token_weights(loss_type, kwargs, w_short, w_long):
    """With A = 1 on-policy, -dloss/dlogp is each token's weight (rows of length 2 and 6)."""
    mask = [[1.0] * 2 + [0.0] * 4, [1.0] * 6]
    _, grad, _ = loss_and_grad(
        [[-1.0] * 6] * 2, None, [1.0, 1.0], mask, loss_type=loss_type, **kwargs
    )
    expected = t64([[w_short] * 2 + [0.0] * 4, [w_long] * 6])
    assert torch.allclose(-grad, expected, rtol=1e-12, atol=0)


def test_cispo_clips_the_weight_and_keeps_every_gradient():
    # rho = (2, 0.5), A = 1, eps_max = 1.5: weights sg(min(rho, 1.5)) = (1.5, 0.5)
    # per-token loss -w * A * logp = (1.5, 1.0); token mean 1.25; dloss/dlogp = -w / 2
    logps = [[-1.0, -2.0]]
    loss, grad, stats = loss_and_grad(logps, with_ratios(logps, [[2.0, 0.5]]), [1.0],
                                      loss_type="cispo", epsilon_high=1.5)  # fmt: skip
    assert loss == pytest.approx(1.25, abs=1e-12)
    assert torch.allclose(grad, t64([[-0.75, -0.25]]), atol=1e-12)
    assert stats["cispo_clip_ratio"] == 0.5  # rho > eps_max with A > 0: one token of two
    assert "clip_ratio/region" not in stats


def test_sapo_gate_value_and_gradient_for_each_sign():
    # Row 0: rho = 1.2, A = +1, tau = 1:    loss -4 sig(0.2),  grad -4 sig(0.2) (1 - sig(0.2)) 1.2
    # Row 1: rho = 0.8, A = -1, tau = 1.05: loss 4/1.05 sig(-0.21), grad 4 sig(-.21)(1-sig(-.21)) .8
    # grpo-style reduction over two one-token rows: each term / 2
    logps = [[-1.0], [-1.0]]
    loss, grad, _ = loss_and_grad(logps, with_ratios(logps, [[1.2], [0.8]]), [1.0, -1.0],
                                  loss_type="sapo")  # fmt: skip
    s0, s1 = sigmoid(0.2), sigmoid(1.05 * -0.2)
    assert loss == pytest.approx((-4 * s0 + 4 / 1.05 * s1) / 2, abs=1e-12)
    expected = t64([[-4 * s0 * (1 - s0) * 1.2 / 2], [4 * s1 * (1 - s1) * 0.8 / 2]])
    assert torch.allclose(grad, expected, atol=1e-12)


def test_luspo_gradient_does_not_depend_on_length():
    # sequence ratio rho = exp(mean log-ratio); loss = mean_i(-rho_i * A_i * L_i); on-policy
    # d/dlogp_t = -A_i * rho_i * L_i * (1 / L_i) / N = -A_i / 2 for every token of row i
    mask = [[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]
    loss, grad, _ = loss_and_grad([[-1.0] * 4] * 2, None, [1.0, -1.0], mask,
                                  loss_type="luspo", importance_sampling_level="sequence")  # fmt: skip
    assert loss == pytest.approx(-(2 * 1.0 + 4 * -1.0) / 2, abs=1e-12)  # = 1.0
    assert torch.allclose(grad, t64([[-0.5, -0.5, 0, 0], [0.5] * 4]), atol=1e-12)


@pytest.mark.parametrize("adv, k, lam", [(1.0, 2.0, 3.0), (-1.0, 3.0, 2.0)])
def test_vespo_weight_value_and_detached_gradient(adv, k, lam):
    # token log-ratios (0.3, -0.1): log w = 0.2 (a sum, not a mean); phi = exp(lam + k 0.2 - lam e^.2)
    # loss = -phi * A * logp, token mean over 2 tokens; phi is a constant: dloss/dlogp = -phi A / 2
    phi = math.exp(lam + k * 0.2 - lam * math.exp(0.2))
    logps = [[-1.0, -2.0]]
    old = [[-1.3, -1.9]]
    loss, grad, stats = loss_and_grad(logps, old, [adv], loss_type="vespo")
    assert stats["vespo/phi_seq_mean"] == pytest.approx(phi, rel=1e-12)
    assert loss == pytest.approx(-phi * adv * (-1.0 - 2.0) / 2, rel=1e-12)
    assert torch.allclose(grad, torch.full((1, 2), -phi * adv / 2, dtype=torch.float64))


def test_vespo_weight_clamps_and_is_one_at_ratio_one():
    mask = torch.ones(3, 2, dtype=torch.float64)
    log_ratio = t64([[0.0, 0.0], [50.0, 50.0], [-30.0, 0.0]])
    phi = vespo_gamma_weights(log_ratio, mask, t64([[1.0], [1.0], [-1.0]]))
    assert phi[0].item() == 1.0
    # log w clamps to 20 (tokens to 20 first): phi = exp(3 + 40 - 3 e^20) underflows to exactly 0
    assert phi[1].item() == 0.0
    # log w = -20 (token clamp) -> clamp to log 1e-8; phi = exp(2 + 3 log 1e-8 - 2e-8)
    assert phi[2].item() == pytest.approx(math.exp(2 + 3 * math.log(1e-8) - 2e-8), rel=1e-9)


@pytest.mark.parametrize(
    "ratio, adv, delta, loss, grad",
    [
        (3.0, -1.0, None, 3.0, 3.0),  # one-sided: -min(-3, -1.2) = 3, unbounded, grad -A rho
        (3.0, -1.0, 2.0, 2.0, 0.0),  # delta caps it: -min(-2, -1.2) = 2, no gradient
        (1.5, -1.0, 2.0, 1.5, 1.5),  # below delta: unchanged
        (0.5, -1.0, 2.0, 0.8, 0.0),  # lower side: PPO's clip at 1 - eps = 0.8
        (3.0, 1.0, 2.0, -1.2, 0.0),  # A > 0: the upper clip 1 + eps = 1.2 binds
    ],
)
def test_delta_clips_both_sides(ratio, adv, delta, loss, grad):
    logps = [[-1.0]]
    value, g, _ = loss_and_grad(logps, with_ratios(logps, [[ratio]]), [adv], delta=delta)
    assert value == pytest.approx(loss, abs=1e-12)
    assert g.item() == pytest.approx(grad, abs=1e-12)


@pytest.mark.parametrize("corrected, grad", [(True, -math.log(2)), (False, -1.0)])
def test_bias_corrected_kl_gradient(corrected, grad):
    # d = ref - logp = log 2; k3 = 1 - log 2. Uncorrected: dk3/dlogp = 1 - e^d = -1.
    # Corrected (k3 * rho, rho = 1 on-policy with drho/dlogp = 1): 1 - e^d + k3 = -d = -log 2.
    # beta = 1, A = 0, one token: the loss is the KL term alone.
    loss, g, stats = loss_and_grad([[-1.0]], None, [0.0], ref=[[-1.0 + math.log(2)]], beta=1.0,
                                   use_bias_correction_kl=corrected)  # fmt: skip
    assert loss == pytest.approx(1 - math.log(2), abs=1e-12)  # the value is unchanged on-policy
    assert g.item() == pytest.approx(grad, abs=1e-12)


def test_bias_corrected_kl_value_is_weighted_by_the_ratio():
    logps = [[-1.0]]
    loss, _, stats = loss_and_grad(logps, with_ratios(logps, [[1.5]]), [0.0],
                                   ref=[[-1.0 + math.log(2)]], beta=1.0,
                                   use_bias_correction_kl=True)  # fmt: skip
    assert loss == pytest.approx(1.5 * (1 - math.log(2)), abs=1e-12)
    assert stats["kl"] == pytest.approx(1.5 * (1 - math.log(2)), abs=1e-12)


def test_off_policy_mask_drops_only_drifted_negative_sequences():
    # behaviour log-probs 0; current -2 / -0.5 / -2: mean log(pi_old / pi) = 2 / 0.5 / 2 vs 1.0
    # row 0 has A > 0 (kept), row 1 drifted little (kept), row 2 is dropped: no gradient.
    logps = [[-2.0] * 4, [-0.5] * 4, [-2.0] * 4]
    old = [[0.0] * 4] * 3
    _, grad, _ = loss_and_grad(
        logps,
        old,
        [1.0, -1.0, -1.0],
        loss_type="dapo",
        off_policy_mask_threshold=1.0,
        epsilon_low=0.9,
    )  # no clipping: 0.1 < rho
    assert (grad[0] != 0).all() and (grad[1] != 0).all()
    assert torch.equal(grad[2], torch.zeros(4, dtype=torch.float64))
