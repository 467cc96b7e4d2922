"""RunState: every field is saved and restored (a new field that cannot round-trip fails here),
and a v0.2 checkpoint's state is read as the fields it became."""

from dataclasses import fields

import torch

from grpo_plugin.evaluation.watch import RewardHackingCallback
from grpo_plugin.rollout.types import TrainingBatch
from grpo_plugin.run.state import RunState
from grpo_plugin.training.metrics import MetricsWindow, ZeroStdWatch


def _fresh(reference=None) -> RunState:
    return RunState(
        MetricsWindow(), ZeroStdWatch(3), RewardHackingCallback(), synced_reference=reference
    )


def _used() -> RunState:
    """A state with every field away from its default."""
    ones = torch.ones(2, 3, dtype=torch.long)
    batch = TrainingBatch(
        prompt_ids=ones, prompt_mask=ones, completion_ids=ones * 2, completion_mask=ones,
        loss_mask=ones, advantages=torch.tensor([0.5, -0.5]),
    )  # fmt: skip
    state = _fresh(torch.nn.Linear(2, 2))
    state.metrics.add("reward", 0.25)
    state.metrics.last_logged_step = 7
    state.zero_std.streak = 2
    state.eval_watch.warned = True
    state.rollout = batch
    state.loss_tokens_per_slice = 12.5
    return state


def _comparable(state: RunState) -> dict:
    out = state.state_dict()
    out["synced_reference"] = {k: v.tolist() for k, v in out["synced_reference"].items()}
    out["rollout"] = {k: v.tolist() for k, v in out["rollout"].items()}
    return out


def test_every_field_round_trips():
    saved = _used()
    restored = _fresh(torch.nn.Linear(2, 2))
    restored.load_state_dict(saved.state_dict(), "cpu")
    assert set(saved.state_dict()) == {f.name for f in fields(RunState)}
    for f in fields(RunState):  # each field, one by one: a field missed would differ here
        assert _comparable(restored)[f.name] == _comparable(saved)[f.name], f.name


def test_a_checkpoint_at_a_rollout_boundary_keeps_no_rollout():
    assert _used().state_dict(mid_rollout=False)["rollout"] is None


def test_a_state_missing_a_field_is_refused_with_the_fix():
    state = _used().state_dict()
    del state["zero_std"]
    try:
        _fresh().load_state_dict(state, "cpu")
    except ValueError as err:
        assert "lacks zero_std" in str(err) and "overwrite_output_dir" in str(err)
    else:
        raise AssertionError("a state without zero_std was loaded")


def test_a_v02_checkpoint_state_is_read():
    old = {
        "buffer": None,
        "loss_tokens_per_slice": 3.0,
        "zero_std_streak": 4,
        "metrics_window": {"reward": [1.0]},
        "metrics_last_logged_step": 5,
        "hacking_alarm_warned": True,
    }
    state = _fresh()
    state.load_state_dict(old, "cpu")
    assert (state.loss_tokens_per_slice, state.zero_std.streak, state.eval_watch.warned) == (
        3.0,
        4,
        True,
    )
    assert state.metrics.state_dict() == {"values": {"reward": [1.0]}, "last_logged_step": 5}
