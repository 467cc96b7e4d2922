"""Tests for grpo_plugin.core.objectives: hand-derived values, clip boundaries, gradcheck, k3,
errors, and agreement with an independent float64 numpy implementation of TRL 1.16's loss
(every loss type; the per-type hand-derived values are in test_surrogates.py)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from grpo_plugin.core.objectives import (
    ESTIMATORS,
    IMPORTANCE_SAMPLING_LEVELS,
    LOSS_TYPES,
    PAPERS,
    LossInputs,
    group_advantages,
    objective_name,
    policy_loss,
)

STAT_KEYS = {"clip_ratio/low", "clip_ratio/high", "clip_ratio/region", "ratio/mean",
             "clip_ratio/low_min", "clip_ratio/high_max"}  # fmt: skip
NAN = float("nan")

CLIPPED = [name for name, d in LOSS_TYPES.items() if d.clipped]  # PPO's clip


def t64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def zeros(*shape: int) -> torch.Tensor:
    return torch.zeros(*shape, dtype=torch.float64)


R2 = math.sqrt(2)  # (1, 0, 0): mean 1/3, population std sqrt(2)/3 -> (sqrt 2, -1/sqrt 2, -1/sqrt 2)


# ----------------------------------------------------------------------------- policy loss


def weights_from_gradient(loss_type: str, lengths: list[int], t: int, **kwargs) -> torch.Tensor:
    """With A = 1 on-policy and beta = 0, -dloss/dlogp[i, t] is the weight of token (i, t)."""
    mask = t64([[1.0] * n + [0.0] * (t - n) for n in lengths])
    logps = (-torch.ones_like(mask)).requires_grad_()
    adv = t64([1.0] * len(lengths))
    loss, _ = policy_loss(LossInputs(logps, None, None, adv, mask), loss_type=loss_type, **kwargs)
    loss.backward()
    return -logps.grad


@pytest.mark.parametrize(
    "loss_type,kwargs,w_short,w_long",
    [
        ("grpo", {}, 1 / 4, 1 / 12),  # sequence level: 1 / (N * length)
        ("dapo", {}, 1 / 8, 1 / 8),  # token level: 1 / total tokens
        ("dr_grpo", {}, 1 / 12, 1 / 12),  # 1 / (N * T)
        ("dr_grpo", {"max_completion_length": 10}, 1 / 20, 1 / 20),
    ],
)
def test_length_weights_for_lengths_two_and_six(loss_type, kwargs, w_short, w_long):
    """Per-token weights of each length normalization, read off the gradient; padding gets 0."""
    weights = weights_from_gradient(loss_type, [2, 6], 6, **kwargs)
    expected = t64([[w_short] * 2 + [0.0] * 4, [w_long] * 6])
    assert torch.allclose(weights, expected, rtol=1e-12, atol=0)


def test_empty_sequence_counts_in_grpo_mean():
    mask = t64([[1.0, 1.0], [0.0, 0.0]])
    logps = torch.full((2, 2), -1.0, dtype=torch.float64)
    loss, _ = policy_loss(LossInputs(logps, None, None, t64([2.0, 5.0]), mask))
    assert loss.item() == pytest.approx(-2.0 / 2)  # row 0 mean is -2, row 1 is 0, N = 2


CLIP_CASES = [  # (ratio relative to a bound, advantage sign, clipped?, counted stat)
    ("high", +1e-3, +1.0, True, "clip_ratio/high"),
    ("high", -1e-3, +1.0, False, None),
    ("high", +1e-3, -1.0, False, None),
    ("high", -1e-3, -1.0, False, None),
    ("low", -1e-3, -1.0, True, "clip_ratio/low"),
    ("low", +1e-3, -1.0, False, None),
    ("low", -1e-3, +1.0, False, None),
    ("low", +1e-3, +1.0, False, None),
]


@pytest.mark.parametrize("bound,offset,adv,clipped,stat", CLIP_CASES)
@pytest.mark.parametrize("level", IMPORTANCE_SAMPLING_LEVELS)
def test_clip_region_just_inside_and_outside_each_bound(bound, offset, adv, clipped, stat, level):
    eps_low, eps_high = 0.2, 0.28  # asymmetric, DAPO clip-higher
    ratio = (1 - eps_low if bound == "low" else 1 + eps_high) + offset
    logps = torch.full((1, 3), -1.0, dtype=torch.float64, requires_grad=True)
    old = logps.detach() - math.log(ratio)
    kwargs = dict(importance_sampling_level=level, epsilon_low=eps_low, epsilon_high=eps_high)
    loss, stats = policy_loss(LossInputs(logps, old, None, t64([adv]), torch.ones(1, 3)), **kwargs)
    loss.backward()
    bound_value = 1 - eps_low if bound == "low" else 1 + eps_high
    expected_objective = (bound_value if clipped else ratio) * adv  # hand-derived table above
    assert loss.item() == pytest.approx(-expected_objective, abs=1e-12)
    expected_grad = 0.0 if clipped else -adv * ratio / 3
    assert torch.allclose(
        logps.grad, torch.full((1, 3), expected_grad, dtype=torch.float64), atol=1e-12
    )
    for key in ("clip_ratio/low", "clip_ratio/high"):
        assert stats[key] == (1.0 if key == stat else 0.0)
    assert stats["clip_ratio/region"] == (1.0 if stat else 0.0)
    assert stats["ratio/mean"] == pytest.approx(ratio, rel=1e-12)


def test_epsilon_high_defaults_to_epsilon_low():
    logps = torch.full((1, 1), -1.0, dtype=torch.float64)
    old = logps - math.log(1.25)
    _, stats_default = policy_loss(
        LossInputs(logps, old, None, t64([1.0]), torch.ones(1, 1)), epsilon_low=0.2
    )
    _, stats_wide = policy_loss(
        LossInputs(logps, old, None, t64([1.0]), torch.ones(1, 1)),
        epsilon_low=0.2,
        epsilon_high=0.3,
    )
    assert stats_default["clip_ratio/high"] == 1.0 and stats_wide["clip_ratio/high"] == 0.0


def test_sequence_ratio_is_length_normalized_geometric_mean():
    # token log-ratios +0.5, -0.5 (and padding): GSPO sees rho = 1 and clips nothing
    logps = t64([[-1.0, -1.0, -1.0]])
    old = t64([[-1.5, -0.5, 7.0]])
    mask = t64([[1.0, 1.0, 0.0]])
    adv = t64([1.0])
    _, seq_stats = policy_loss(
        LossInputs(logps, old, None, adv, mask), importance_sampling_level="sequence"
    )
    _, tok_stats = policy_loss(
        LossInputs(logps, old, None, adv, mask), importance_sampling_level="token"
    )
    assert seq_stats["ratio/mean"] == pytest.approx(1.0) and seq_stats["clip_ratio/region"] == 0.0
    assert tok_stats["clip_ratio/high"] == pytest.approx(0.5)
    assert tok_stats["ratio/mean"] == pytest.approx((math.exp(0.5) + math.exp(-0.5)) / 2)


def test_on_policy_none_equals_detached_copy_and_has_signal():
    gen = torch.Generator().manual_seed(3)
    base = -torch.rand(3, 4, generator=gen, dtype=torch.float64)
    adv, mask = t64([1.0, -0.5, 0.25]), t64([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    grads = []
    for old in (None, base.clone()):
        logps = base.clone().requires_grad_()
        loss, stats = policy_loss(LossInputs(logps, old, None, adv, mask))
        loss.backward()
        grads.append(logps.grad)
        assert stats["ratio/mean"] == pytest.approx(1.0)
    assert torch.equal(grads[0], grads[1]) and grads[0].abs().sum() > 0


def test_kl_term_value_stats_and_beta_zero():
    logps = t64([[-1.0, -2.0]])
    ref = t64([[-1.0 + math.log(2), -2.0]])  # k3 = 1 - log 2 on the first token, 0 on the second
    mask, adv = torch.ones(1, 2), t64([0.0])
    k3 = 1 - math.log(2)
    loss, stats = policy_loss(LossInputs(logps, None, ref, adv, mask), beta=0.5)
    assert loss.item() == pytest.approx(0.5 * k3 / 2, abs=1e-12)
    assert set(stats) == STAT_KEYS | {"kl"} and stats["kl"] == pytest.approx(k3 / 2)
    loss0, stats0 = policy_loss(LossInputs(logps, None, ref, adv, mask), beta=0.0)
    assert loss0.item() == 0.0 and stats0["kl"] == pytest.approx(k3 / 2)
    _, no_ref = policy_loss(LossInputs(logps, None, None, adv, mask))
    assert set(no_ref) == STAT_KEYS and all(type(v) is float for v in no_ref.values())


def test_padding_with_inf_and_nan_does_not_leak():
    logps = t64([[-1.0, -math.inf], [-0.5, NAN]]).requires_grad_()
    old = t64([[-1.1, NAN], [-0.4, -math.inf]])
    ref = t64([[-0.9, math.inf], [-0.6, NAN]])
    mask = torch.tensor([[True, False], [True, False]])
    for loss_type, level in itertools.product(LOSS_TYPES, IMPORTANCE_SAMPLING_LEVELS):
        kwargs = dict(loss_type=loss_type, importance_sampling_level=level, beta=0.1)
        loss, stats = policy_loss(LossInputs(logps, old, ref, t64([1.0, -1.0]), mask), **kwargs)
        (grad,) = torch.autograd.grad(loss, logps)
        assert torch.isfinite(loss) and torch.isfinite(grad).all() and grad[:, 1].eq(0).all()
        assert all(math.isfinite(v) for v in stats.values())


# ----------------------------------------------------------------------------- gradcheck


def off_kink_inputs(level: str, seed: int, eps_low: float = 0.2, eps_high: float = 0.28):
    """Random (logps, old, ref, adv, mask) whose ratios sit >= 0.03 from 1 - eps_low, 1 + eps_high."""
    gen = torch.Generator().manual_seed(seed)
    n, t = 5, 6
    lengths = torch.tensor([6, 4, 1, 3, 0])
    mask = (torch.arange(t) < lengths[:, None]).to(torch.float64)  # (N, T), one empty row
    safe_ratios = t64([0.5, 0.7, 0.9, 1.0, 1.1, 1.2, 1.35, 1.6])  # away from 0.8 and 1.28
    pick = lambda shape: safe_ratios[torch.randint(len(safe_ratios), shape, generator=gen)]  # noqa: E731
    if level == "token":
        log_ratio = pick((n, t)).log()
    else:  # per-sequence target plus zero-mean noise over the valid tokens
        noise = 0.3 * torch.randn(n, t, generator=gen, dtype=torch.float64) * mask
        noise = noise - mask * noise.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
        log_ratio = pick((n, 1)).log() + noise
    logps = -torch.rand(n, t, generator=gen, dtype=torch.float64) * 3 - 0.1
    ref = logps + 0.5 * torch.randn(n, t, generator=gen, dtype=torch.float64)
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    return logps, logps - log_ratio, ref, adv, mask


# vespo's weight is detached by design (its gradient is not the derivative of its value):
# test_surrogates.py checks its gradient by hand. cispo's weight is detached too, so it is
# gradchecked where every ratio is clipped to eps_max (a constant weight).
@pytest.mark.parametrize(("beta", "bias_corrected"), [(0.0, False), (0.04, False), (0.04, True)])
@pytest.mark.parametrize("level", IMPORTANCE_SAMPLING_LEVELS)
@pytest.mark.parametrize("loss_type", [t for t in LOSS_TYPES if t != "vespo"])
def test_gradcheck_float64(loss_type, level, beta, bias_corrected):
    logps, old, ref, adv, mask = off_kink_inputs(level, seed=7)
    kwargs = dict(
        loss_type=loss_type,
        importance_sampling_level=level,
        epsilon_low=0.2,
        epsilon_high=0.3 if loss_type == "cispo" else 0.28,  # all ratios >= 0.5: clipped
        beta=beta,
        use_bias_correction_kl=bias_corrected,  # the KL weighted by the (detached) ratio
        delta=1.5 if loss_type in CLIPPED else None,  # two-sided clipping too
    )
    _, stats = policy_loss(LossInputs(logps, old, ref, adv, mask), **kwargs)
    if loss_type in CLIPPED:
        assert stats["clip_ratio/region"] > 0  # the clipped branch is exercised too
    logps = logps.clone().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda lp: policy_loss(LossInputs(lp, old, ref, adv, mask), **kwargs)[0],
        (logps,),
        eps=1e-6,
        atol=1e-8,
        rtol=1e-6,
    )


# ----------------------------------------------------------------------------- numpy reference


def np_advantages(rewards: np.ndarray, estimator: str, eps: float = 1e-8) -> np.ndarray:
    out = np.zeros_like(rewards)
    flat = rewards[~np.isnan(rewards)]
    batch_std = flat.std() if flat.size else 0.0
    for p, row in enumerate(rewards):
        idx = np.flatnonzero(~np.isnan(row))
        if idx.size < 2:
            continue
        scored = row[idx]
        if estimator == "grpo":
            std = scored.std()
            out[p, idx] = (scored - scored.mean()) / (std + eps) if std > eps else 0.0
        elif estimator == "dr_grpo":
            out[p, idx] = scored - scored.mean()
        elif estimator == "rloo":
            out[p, idx] = [r - np.delete(scored, k).mean() for k, r in enumerate(scored)]
        else:
            out[p, idx] = (scored - scored.mean()) / (batch_std + eps) if batch_std > eps else 0.0
    return out


def np_token_objective(loss_type, rho, lp, a, el, eh, delta, phi):
    """TRL 1.16's per-token objective (to maximise) for one token."""
    if loss_type == "cispo":
        return min(rho, eh) * a * lp
    if loss_type == "sapo":
        tau = 1.0 if a > 0 else 1.05
        return 4.0 / tau / (1.0 + math.exp(-tau * (rho - 1.0))) * a
    if loss_type == "vespo":
        return phi * a * lp
    capped = rho if delta is None else min(rho, delta)
    return min(capped * a, min(max(rho, 1 - el), 1 + eh) * a)


def np_vespo_phi(log_ratios, a):
    k, lam = (2.0, 3.0) if a >= 0 else (3.0, 2.0)
    log_w = min(max(sum(min(max(x, -20.0), 20.0) for x in log_ratios), math.log(1e-8)), 20.0)
    return math.exp(lam + k * log_w - lam * math.exp(log_w))


def np_policy_loss(lp, old, ref, adv, mask, **spec):
    """TRL 1.16's loss, one token at a time, in float64 numpy."""
    loss_type, level, beta = spec["loss_type"], spec["importance_sampling_level"], spec["beta"]
    el, max_len, delta = spec["epsilon_low"], spec["max_completion_length"], spec.get("delta")
    eh = spec["epsilon_high"] or el
    n, t = lp.shape
    loss_rows, seq_sums, ratios, klv = [], [], np.zeros((n, t)), np.zeros((n, t))
    total, n_tok, phis, seq_fracs = 0.0, 0, [], []
    low = high = cispo = 0
    for i in range(n):
        valid = np.flatnonzero(mask[i])
        seq_log = (lp[i, valid] - old[i, valid]).sum() / max(1, valid.size)
        phi = np_vespo_phi(lp[i, valid] - old[i, valid], adv[i])
        phis.append(phi)
        terms, seq_low, seq_high = [], 0, 0
        for j in valid:
            rho = math.exp(seq_log if level == "sequence" else lp[i, j] - old[i, j])
            o = np_token_objective(loss_type, rho, lp[i, j], adv[i], el, eh, delta, phi)
            d = ref[i, j] - lp[i, j]
            klv[i, j] = (math.exp(d) - d - 1) * (rho if spec["use_bias_correction_kl"] else 1.0)
            terms.append(-o + beta * klv[i, j])
            ratios[i, j] = rho
            seq_low += rho < 1 - el and adv[i] < 0
            seq_high += rho > 1 + eh and adv[i] > 0
            cispo += rho > eh and adv[i] > 0
        low, high = low + seq_low, high + seq_high
        if valid.size:  # TRL's extremes over the sequences of their clipped fractions
            seq_fracs.append((seq_low / valid.size, seq_high / valid.size))
        loss_rows.append(sum(terms) / max(1, valid.size))
        seq_sums.append(sum(terms))
        total += sum(terms)
        n_tok += valid.size
    token_mean = total / max(1, n_tok)
    loss = {"grpo": np.mean(loss_rows), "sapo": np.mean(loss_rows), "dapo": token_mean,
            "bnpo": token_mean, "cispo": token_mean, "vespo": token_mean,
            "dr_grpo": total / (n * (max_len or t)), "luspo": np.mean(seq_sums)}[loss_type]  # fmt: skip
    nv = max(1, n_tok)
    stats = {"ratio/mean": ratios.sum() / nv, "kl": klv.sum() / nv}
    if loss_type in CLIPPED:
        stats.update({"clip_ratio/low": low / nv, "clip_ratio/high": high / nv,
                      "clip_ratio/region": (low + high) / nv})  # fmt: skip
        stats["clip_ratio/low_min"] = min((f[0] for f in seq_fracs), default=0.0)
        stats["clip_ratio/high_max"] = max((f[1] for f in seq_fracs), default=0.0)
    if loss_type == "cispo":
        stats["cispo_clip_ratio"] = cispo / nv
    if loss_type == "vespo":
        stats["vespo/phi_seq_mean"] = float(np.mean(phis))
    return loss, stats


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_independent_numpy_reference(seed):
    rng = np.random.default_rng(seed)
    num_prompts, group, t = 4, 4, 7
    rewards = rng.integers(0, 3, size=(num_prompts, group)).astype(np.float64) * rng.random(
        (num_prompts, group)
    )
    rewards[rng.random(rewards.shape) < 0.2] = np.nan
    rewards[0] = [1.0, np.nan, np.nan, np.nan]
    n = num_prompts * group
    lengths = rng.integers(0, t + 1, size=n)
    mask = (np.arange(t) < lengths[:, None]).astype(np.float64)
    lp = -rng.random((n, t)) * 4
    old = lp + rng.normal(0, 0.3, size=(n, t))
    ref = lp + rng.normal(0, 0.5, size=(n, t))
    lp[mask == 0] = -np.inf  # padding garbage must be ignored
    arrays = (lp, old, ref, mask)
    tensors = [torch.from_numpy(a) for a in arrays]
    for estimator in ESTIMATORS:
        expected_adv = np_advantages(rewards, estimator)
        adv = group_advantages(torch.from_numpy(rewards), estimator)
        np.testing.assert_allclose(adv.numpy(), expected_adv, rtol=1e-12, atol=1e-12)
        for loss_type, level, beta, (el, eh, max_len, delta, corrected) in itertools.product(
            LOSS_TYPES,
            IMPORTANCE_SAMPLING_LEVELS,
            [0.0, 0.04],
            [(0.2, None, None, None, False), (0.1, 0.3, 9, 1.2, True)],
        ):
            spec = dict(loss_type=loss_type, importance_sampling_level=level, beta=beta)
            spec.update(epsilon_low=el, epsilon_high=eh, max_completion_length=max_len)
            spec.update(delta=delta, use_bias_correction_kl=corrected)
            loss, stats = policy_loss(LossInputs(*tensors[:3], adv.reshape(-1), tensors[3]), **spec)
            ref_loss, ref_stats = np_policy_loss(
                *arrays[:3], expected_adv.reshape(-1), mask, **spec
            )
            assert loss.item() == pytest.approx(ref_loss, rel=1e-10, abs=1e-12)
            assert stats == pytest.approx(ref_stats, rel=1e-10, abs=1e-12)


# ----------------------------------------------------------------------------- errors and names


def call(**overrides):
    tensors = dict(
        logps=torch.zeros(2, 3),
        old_logps=None,
        ref_logps=None,
        advantages=torch.zeros(2),
        mask=torch.ones(2, 3),
    )
    tensors.update({k: overrides.pop(k) for k in list(overrides) if k in LossInputs._fields})
    return policy_loss(LossInputs(**tensors), **overrides)


@pytest.mark.parametrize(
    "overrides,pattern",
    [
        (dict(loss_type="ppo"), "loss_type must be one of 'grpo', 'dapo', 'dr_grpo', 'bnpo'"),
        (
            dict(importance_sampling_level="group"),
            "importance_sampling_level must be one of 'token', 'sequence'",
        ),
        (dict(beta=0.04), "beta=0.04 > 0 needs ref_logps"),
        (dict(beta=-0.1), r"beta=-0.1 must be >= 0"),
        (dict(epsilon_low=0.0), r"epsilon=0.0 \(the lower clip epsilon\) must be in \(0, 1\)"),
        (dict(epsilon_low=1.0), r"epsilon=1.0 \(the lower clip epsilon\) must be in \(0, 1\)"),
        (dict(epsilon_high=0.0), "epsilon_high=0.0 must be > 0"),
        (dict(max_completion_length=0), "max_completion_length=0 must be a positive int"),
        (
            dict(old_logps=torch.zeros(2, 4)),
            r"old_logps must have the same shape as logps \(2, 3\)",
        ),
        (dict(ref_logps=torch.zeros(3, 3)), r"ref_logps must have the same shape as logps"),
        (dict(mask=torch.ones(2, 2)), r"mask must have the same shape as logps"),
        (dict(advantages=torch.zeros(2, 1)), r"advantages must have shape \(N,\) = \(2,\)"),
        (dict(logps=torch.zeros(6), mask=torch.ones(6)), r"logps must have shape \(N, T\)"),
    ],
)
def test_policy_loss_errors(overrides, pattern):
    with pytest.raises(ValueError, match=pattern):
        call(**overrides)


def test_policy_loss_type_errors():
    with pytest.raises(TypeError, match="advantages must be a torch.Tensor"):
        call(advantages=[0.0, 0.0])
    with pytest.raises(TypeError, match="floating-point"):
        call(logps=torch.zeros(2, 3, dtype=torch.long))


def test_objective_names_and_papers():
    assert objective_name("grpo", "token", "grpo") == "GRPO"
    assert objective_name("dapo", "token", "grpo") == "DAPO"
    assert objective_name("dr_grpo", "token", "dr_grpo") == "Dr. GRPO"
    assert objective_name("grpo", "token", "dr_grpo") == "Dr. GRPO"
    assert objective_name("grpo", "sequence", "grpo") == "GSPO"
    assert objective_name("grpo", "token", "rloo") == "RLOO"
    assert objective_name("cispo", "token", "grpo") == "CISPO"
    assert objective_name("luspo", "sequence", "grpo") == "LUSPO"
    assert objective_name("bnpo", "token", "grpo") == "GRPO"
    assert PAPERS == {
        "GRPO": "https://arxiv.org/abs/2402.03300",
        "DAPO": "https://arxiv.org/abs/2503.14476",
        "Dr. GRPO": "https://arxiv.org/abs/2503.20783",
        "GSPO": "https://arxiv.org/abs/2507.18071",
        "RLOO": "https://arxiv.org/abs/2402.14740",
        "CISPO": "https://arxiv.org/abs/2506.13585",
        "SAPO": "https://arxiv.org/abs/2511.20347",
        "LUSPO": "https://arxiv.org/abs/2602.05261",
        "VESPO": "https://arxiv.org/abs/2602.10693",
    }
    with pytest.raises(ValueError, match="estimator must be one of"):
        objective_name("grpo", "token", "ppo")


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_objective_name_refuses_an_unknown_loss_type_whatever_the_estimator(estimator):
    with pytest.raises(ValueError, match="loss_type must be one of"):
        objective_name("ppo", "token", estimator)  # "rloo" too: checked before its early return
