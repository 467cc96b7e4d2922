"""The trainer's resumable state: everything beyond weights, optimizer, scheduler and RNG that
decides the rest of a run, in one object owned by `GRPOTrainer`.

`transformers.Trainer` restores weights, optimizer, scheduler and RNG from a checkpoint; a GRPO
run also carries the rollout being consumed (a rollout can span a checkpoint), dapo's loss
normaliser for it, the metrics window not yet logged, the zero-std streak, whether the
reward-hacking alarm already spoke, and (with `sync_ref_model`) the moving reference. Each
process saves its own `RunState` with every checkpoint (`checkpoints.save_state`), and a
resume loads it back, so the resumed run continues exactly as the uninterrupted one.

`state_dict()` walks the dataclass's fields: a new field is saved and restored without anyone
remembering to, and `tests/run/test_state.py` fails for a field it cannot round-trip.
Components with their own `state_dict` / `load_state_dict` (the metrics window, the watches, a
module) are asked for theirs.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from ..rollout.types import TrainingBatch

# v0.2 checkpoints wrote these keys; read them as the fields they became.
_V02_KEYS = {
    "buffer": "rollout",
    "metrics_window": None,  # with metrics_last_logged_step: `metrics`
    "zero_std_streak": "zero_std",
    "hacking_alarm_warned": "eval_watch",
    "ref_model": "synced_reference",
}


@dataclass
class RunState:
    """What a resume restores besides weights, optimizer, scheduler and RNG (one per process)."""

    metrics: Any  # metrics.MetricsWindow: values collected since the last log
    zero_std: Any  # metrics.ZeroStdWatch: rollouts in a row with no reward spread
    eval_watch: Any  # evaluation.watch.RewardHackingCallback: whether it warned
    rollout: TrainingBatch | None = None  # the rollout whose micro-batches are being trained
    loss_tokens_per_slice: float = 1.0  # dapo's normaliser for that rollout
    synced_reference: torch.nn.Module | None = None  # sync_ref_model's moving reference

    def state_dict(self, mid_rollout: bool = True) -> dict[str, Any]:
        """Plain values and CPU tensors. The rollout is kept only `mid_rollout` (a checkpoint at
        a rollout boundary samples a new one when resumed)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, TrainingBatch):
                value = _batch_tensors(value) if mid_rollout else None
            elif hasattr(value, "state_dict"):
                value = _to_cpu(value.state_dict())
            out[f.name] = value
        return out

    def load_state_dict(self, state: dict[str, Any], device: torch.device | str) -> None:
        """Restore what `state_dict` wrote (or what a v0.2 checkpoint wrote)."""
        state = _from_v02(state) if "metrics_window" in state else state
        missing = [f.name for f in fields(self) if f.name not in state]
        if missing:
            raise ValueError(
                f"the checkpoint's run state lacks {', '.join(missing)}; it was written by "
                "another version: resume from a checkpoint of this version, or start afresh "
                "with overwrite_output_dir=True"
            )
        for f in fields(self):
            saved, current = state[f.name], getattr(self, f.name)
            if f.name == "rollout":
                self.rollout = None if saved is None else TrainingBatch(**saved).to(device)
            elif hasattr(current, "load_state_dict"):
                if saved is not None:
                    current.load_state_dict(saved)
            else:
                setattr(self, f.name, saved)


def mid_rollout(args: Any, global_step: int) -> bool:
    """Whether optimizer step `global_step` ends inside a rollout (its micro-batches not all
    trained), so that a checkpoint there must keep the rollout."""
    per_rollout = args.steps_per_generation * args.num_iterations
    return (global_step * args.gradient_accumulation_steps) % per_rollout != 0


def _batch_tensors(batch: TrainingBatch) -> dict[str, torch.Tensor]:
    return {
        f.name: getattr(batch, f.name).cpu()
        for f in fields(batch)
        if getattr(batch, f.name) is not None
    }


def _to_cpu(state: Any) -> Any:
    if isinstance(state, torch.Tensor):
        return state.cpu()
    if isinstance(state, dict):
        return {k: _to_cpu(v) for k, v in state.items()}
    return state


def _from_v02(state: dict[str, Any]) -> dict[str, Any]:
    out = {new: state.get(old) for old, new in _V02_KEYS.items() if new is not None}
    out["metrics"] = {
        "values": state["metrics_window"],
        "last_logged_step": state["metrics_last_logged_step"],
    }
    out["zero_std"] = {"streak": state["zero_std_streak"]}
    out["eval_watch"] = {"warned": state["hacking_alarm_warned"]}
    out["loss_tokens_per_slice"] = state["loss_tokens_per_slice"]
    return out
