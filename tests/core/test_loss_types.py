"""The loss-type registry is the one source: every loss type is one definition, read everywhere."""

from __future__ import annotations

import logging

import pytest
import torch

from grpo_plugin.config.field_checks import warn_on_loss_combinations
from grpo_plugin.config.grpo_config import GRPOConfig
from grpo_plugin.core import loss_types
from grpo_plugin.core.loss_types import LOSS_TYPES, LossType, SurrogateTerms, register
from grpo_plugin.core.objectives import LossInputs, LossParams, objective_name, policy_loss

# each registered loss type's row: its reduction, token mean, clip stats, name at token level
ROWS = {
    "grpo": ("sequence_mean", None, True, "GRPO"),
    "dapo": ("token_mean", "rollout", True, "DAPO"),
    "dr_grpo": ("constant_length", None, True, "Dr. GRPO"),
    "bnpo": ("token_mean", "micro_batch", True, "GRPO"),
    "luspo": ("sequence_sum", None, True, "LUSPO"),
    "cispo": ("token_mean", "rollout", False, "CISPO"),
    "sapo": ("sequence_mean", None, False, "SAPO"),
    "vespo": ("token_mean", "rollout", False, "VESPO"),
}


def test_every_registered_loss_type_has_its_row_here():
    assert list(LOSS_TYPES) == list(ROWS)


@pytest.mark.parametrize("name", list(ROWS))
def test_a_definition_says_what_its_row_says(name):
    reduction, token_mean, clipped, objective = ROWS[name]
    definition = LOSS_TYPES[name]
    assert definition.reduce.__name__ == reduction
    assert (definition.token_mean, definition.clipped) == (token_mean, clipped)
    assert objective_name(name, "token", "grpo") == objective
    assert all(hasattr(LossParams(), field) for field in definition.parameters)


def test_the_config_offers_exactly_the_registered_loss_types(tmp_path):
    help_text = GRPOConfig.__dataclass_fields__["loss_type"].metadata["help"]
    for name in LOSS_TYPES:
        assert f"'{name}' (" in help_text
    with pytest.raises(ValueError, match="loss_type must be one of 'grpo', 'dapo'"):
        GRPOConfig(output_dir=str(tmp_path), loss_type="ppo")


def test_the_reductions_by_hand():
    masked = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]])  # (2, 3), padding zeroed
    weight = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert loss_types.sequence_mean(masked, weight, 3).item() == pytest.approx((1.5 + 3.0) / 2)
    assert loss_types.token_mean(masked, weight, 3).item() == pytest.approx(6.0 / 3)
    assert loss_types.constant_length(masked, weight, 4).item() == pytest.approx(6.0 / 8)
    assert loss_types.sequence_sum(masked, weight, 3).item() == pytest.approx((3.0 + 3.0) / 2)


@pytest.fixture
def linear_loss():
    """A loss type a user adds: the unclipped surrogate, registered for the test, then removed."""

    def linear(t: SurrogateTerms, p: LossParams):
        return -t.ratio * t.adv, {"linear/mean_ratio": 1.0}

    definition = LossType(
        "linear",
        "the unclipped surrogate",
        linear,
        loss_types.token_mean,
        level=("token", "is meant for token ratios"),
    )
    register(definition)
    yield definition
    del LOSS_TYPES["linear"]


def test_a_new_loss_type_is_one_registered_definition(linear_loss, tmp_path, caplog):
    """One LossType: policy_loss, the config's checks and the objective's name follow it."""
    logps = torch.log(torch.tensor([[0.5, 0.25]])).requires_grad_(True)
    adv, mask = torch.tensor([2.0]), torch.ones(1, 2)
    loss, stats = policy_loss(LossInputs(logps, None, None, adv, mask), loss_type="linear")
    loss.backward()
    # on-policy rho = 1 with d rho / d log pi = 1: loss = -A * mean(rho) = -2, grad -A / 2 each
    assert loss.item() == pytest.approx(-2.0)
    assert torch.allclose(logps.grad, torch.tensor([[-1.0, -1.0]]))
    assert stats["linear/mean_ratio"] == 1.0 and "clip_ratio/low" not in stats
    assert objective_name("linear", "sequence", "grpo") == "GSPO"
    config = GRPOConfig(
        output_dir=str(tmp_path), loss_type="linear", importance_sampling_level="sequence"
    )
    with caplog.at_level(logging.WARNING):
        warn_on_loss_combinations(config)
    assert "loss_type='linear' is meant for token ratios." in caplog.text
    with pytest.raises(ValueError, match="registered twice"):
        register(linear_loss)


def test_a_loss_types_parameter_check_runs_before_any_loss():
    with pytest.raises(ValueError, match="sapo_temperature_neg=0.0 must be > 0"):
        LossParams(loss_type="grpo", sapo_temperature_neg=0.0)
