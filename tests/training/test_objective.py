"""`TrainingObjective` across processes (the collectives faked) and its checkpointed state."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_config

from grpo_plugin.rollout.types import TrainingBatch
from grpo_plugin.training import objective as objective_module
from grpo_plugin.training.objective import TrainingObjective


def batch(mask) -> TrainingBatch:
    mask = torch.tensor(mask)
    ids = torch.ones_like(mask)
    return TrainingBatch(ids, ids, ids, mask, mask, advantages=torch.tensor([1.0, -1.0]))


def other_process_has(monkeypatch, **values):
    """Fake a second process: `mean_over_processes(x)` is the mean of x and the other's value
    (given in call order: `tokens=[...]`)."""
    others = iter(values["tokens"])
    monkeypatch.setattr(
        objective_module.distributed, "mean_over_processes", lambda acc, v: (v + next(others)) / 2
    )


def test_bnpo_is_this_process_share_of_the_global_token_mean(tmp_path, monkeypatch):
    # 3 tokens here, 5 on the other process: the global token mean divides by 8 tokens, so this
    # process's loss is sum_here / (8 / 2) and the average over both is sum_all / 8.
    logps = torch.full((2, 2), -1.0, requires_grad=True)
    entropy = torch.zeros(2, 2)
    b = batch([[1, 1], [1, 0]])
    local, _ = TrainingObjective(tiny_config(tmp_path, loss_type="bnpo"))(logps, entropy, b, 1.0)
    other_process_has(monkeypatch, tokens=[5.0])
    spread = TrainingObjective(tiny_config(tmp_path, loss_type="bnpo"))
    loss, _ = spread(logps, entropy, b, 1.0)
    assert loss.item() == pytest.approx(local.item() * 3 / 4)
    (grad,) = torch.autograd.grad(loss, logps)
    # on-policy grad of -A * rho per token over 4 tokens: -A / 4 (A = +1 row 0, -1 row 1)
    assert grad.flatten().tolist() == pytest.approx([-0.25, -0.25, 0.25, 0.0])


def test_entropy_bonus_divides_by_the_global_token_count(tmp_path, monkeypatch):
    logps = torch.zeros(2, 2, requires_grad=True)
    entropy = torch.tensor([[1.0, 2.0], [3.0, 9.0]], requires_grad=True)
    other_process_has(monkeypatch, tokens=[1.0])  # 3 tokens here, 1 there: mean 2
    objective = TrainingObjective(tiny_config(tmp_path, loss_type="grpo", entropy_coef=0.5))
    loss, metrics = objective(logps, entropy, batch([[1, 1], [1, 0]]), 1.0)
    assert loss.item() == pytest.approx(metrics["policy_loss"] - 0.5 * (1 + 2 + 3) / 2)
    assert metrics["entropy"] == pytest.approx(2.0)  # the logged entropy stays this batch's mean


def test_adaptive_coefficient_moves_on_the_entropy_of_every_process(tmp_path, monkeypatch):
    config = tiny_config(tmp_path, use_adaptive_entropy=True, entropy_target=1.0,
                         entropy_coef_delta=0.1)  # fmt: skip
    objective = TrainingObjective(config)
    objective.entropy.observe(entropy_sum=1.0, tokens=2.0)  # 0.5 here, below the target ...
    other_process_has(monkeypatch, tokens=[9.0, 4.0])  # ... but (1 + 9) / (2 + 4) = 1.67 overall
    assert objective.end_optimizer_step() == {"entropy_coef": 0.0}  # moved down (clamped at 0)
    assert objective.entropy.last_entropy == pytest.approx(10 / 6)


def test_adaptive_state_round_trips_through_a_checkpoint_folder(tmp_path):
    config = tiny_config(tmp_path, use_adaptive_entropy=True, entropy_coef=0.3)
    saved = TrainingObjective(config)
    saved.entropy.coef, saved.entropy.last_entropy = 0.42, 0.17
    saved.save_state(tmp_path)
    restored = TrainingObjective(config)
    restored.load_state(str(tmp_path))
    assert (restored.entropy.coef, restored.entropy.last_entropy) == (0.42, 0.17)
    restored.load_state(None)  # no checkpoint: unchanged
    assert restored.entropy.coef == 0.42


def test_the_moe_router_loss_is_added_with_its_coefficient(tmp_path):
    logps = torch.full((2, 2), -1.0, requires_grad=True)
    entropy, b = torch.zeros(2, 2), batch([[1, 1], [1, 0]])
    plain, _ = TrainingObjective(tiny_config(tmp_path, loss_type="grpo"))(logps, entropy, b, 1.0)
    with_aux = TrainingObjective(tiny_config(tmp_path, loss_type="grpo"), aux_loss_coef=0.01)
    aux = torch.tensor(2.5, requires_grad=True)
    loss, metrics = with_aux(logps, entropy, b, 1.0, aux)
    assert loss.item() == pytest.approx(plain.item() + 0.01 * 2.5)
    assert metrics["aux_loss"] == pytest.approx(2.5)
    (grad,) = torch.autograd.grad(loss, aux)
    assert grad.item() == pytest.approx(0.01)  # the router gets exactly coef of the gradient


def test_an_evaluation_loss_gathers_nothing_and_moves_no_state(tmp_path, monkeypatch):
    """Processes evaluate different numbers of chunks: a collective there would hang a run."""

    def local_only(name):
        real = getattr(objective_module.distributed, name)

        def call(accelerator, value):
            assert accelerator is None, f"evaluation called the collective {name}"
            return real(accelerator, value)  # one process: the value itself

        monkeypatch.setattr(objective_module.distributed, name, call)

    local_only("mean_over_processes")
    local_only("gather_objects")
    config = tiny_config(tmp_path, loss_type="dapo", entropy_coef=0.5, use_adaptive_entropy=True,
                         entropy_target=5.0)  # fmt: skip
    objective = TrainingObjective(config, accelerator=object())  # trains on several processes
    objective.entropy.last_entropy = 1.0  # below the target: the bonus applies at c = 0.5
    entropy = torch.tensor([[1.0, 2.0], [3.0, 9.0]])
    loss, metrics = objective.evaluation_loss(torch.zeros(2, 2), entropy, batch([[1, 1], [1, 0]]))
    # on-policy, ratio 1: per-token -A = (-1, -1 | +1), dapo's mean over this chunk's 3 tokens
    assert metrics["policy_loss"] == pytest.approx(-1 / 3)
    assert loss.item() == pytest.approx(-1 / 3 - 0.5 * (1 + 2 + 3) / 3)
    assert objective.entropy.window() == (0.0, 0.0)  # the adaptive coefficient saw nothing
    assert objective.accelerator is not None  # the training objective itself is unchanged
