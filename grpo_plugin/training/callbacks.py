"""Trainer callbacks: the run's progress and `metrics.jsonl`; TR-DPO reference syncing.

The Trainer's own tqdm bar and its dict-printing callback are replaced by `RunProgressCallback`:
training as one task on the process's progress board (`progress.py`: a live line in a terminal,
plain lines elsewhere) with the step, the reward (and KL when logged), seconds per step and the
time left, and one more task while a held-out set is evaluated (during training, and before and
after it in the recipe pipeline). It is there unless `disable_tqdm=True`, as the Trainer's bar.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from ..run.rundir import append_metrics
from . import progress
from .progress import ProgressBoard, format_duration


def replace_default_callbacks(trainer: Any) -> None:
    """The Trainer's printer and tqdm bar out; metrics.jsonl and the run's progress in."""
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    bar = None if trainer.args.disable_tqdm else RunProgressCallback()
    trainer.add_callback(MetricsJsonlCallback(trainer.step_log, bar))
    if bar is not None:
        trainer.add_callback(bar)


SUMMARY_KEYS = ("train_", "total_flos", "epoch")  # the Trainer's end-of-training log


class MetricsJsonlCallback(TrainerCallback):
    """`metrics.jsonl` (rundir), one JSON line per optimizer step (`step_log()`: that step's
    metrics, whatever `logging_steps` is; shown on the progress bar too), plus the evaluation logs
    and the end-of-training summary as the Trainer logs them. The Trainer's periodic train logs
    (`logging_steps`: averages of steps already written) are not repeated."""

    def __init__(self, step_log: Callable[[], dict[str, float]], bar=None) -> None:
        self.step_log, self.bar = step_log, bar

    def on_step_end(self, args, state, control, **kwargs):
        record = self.step_log()  # on every process: it reduces across them
        if state.is_world_process_zero:
            append_metrics(args.output_dir, state.global_step, record)
            if self.bar is not None:
                self.bar.show(record, state)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not (state.is_world_process_zero and logs):
            return
        if "train_runtime" in logs:  # the summary's own keys: the window's averages in it
            logs = {k: v for k, v in logs.items() if k.startswith(SUMMARY_KEYS)}  # read as a step
        elif "loss" in logs:  # a periodic log: averages of steps already written
            return
        append_metrics(args.output_dir, state.global_step, logs)


OUTCOME_PREFIX = "outcome/"  # `outcome/<reward>/<outcome>`: a reward's share of completions


def outcome_summary(logs: dict[str, float], shown: int = 3) -> str:
    """The step's most common outcomes of each reward that logs them (`code_tests`: why its
    programs failed), e.g. "code_tests: 50% syntax_error, 25% wrong_answer, 19% passed"."""
    by_reward: dict[str, list[tuple[float, str]]] = {}
    for key, value in logs.items():
        if key.startswith(OUTCOME_PREFIX) and value is not None and value > 0:
            reward, _, name = key.removeprefix(OUTCOME_PREFIX).rpartition("/")
            by_reward.setdefault(reward, []).append((value, name))
    parts = []
    for reward, shares in sorted(by_reward.items()):
        top = sorted(shares, key=lambda share: -share[0])[:shown]
        parts.append(f"{reward}: " + ", ".join(f"{v:.0%} {name}" for v, name in top))
    return "; ".join(parts)


class RunProgressCallback(TrainerCallback):
    """Training as one task: step, mean reward (KL, held-out accuracy when logged), seconds per
    optimizer step and the time left at the mean pace of this session's steps."""

    LOGGED = (
        ("reward", "reward {:.3f}"),
        ("kl", "kl {:.4f}"),
        ("eval_accuracy", "eval accuracy {:.3f}"),
    )

    def __init__(self, board: ProgressBoard | None = None) -> None:
        self.board = board
        self.task: progress.Task | None = None
        self._fields: dict[str, str] = {}
        self._first_step = 0
        self._begin = self._last = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        if self.task is not None:  # a previous train() that raised: its line goes
            self.task.finish("")
        self.board = self.board or progress.board()
        self._first_step, self._fields = state.global_step, {}
        self._begin = self._last = time.monotonic()
        self.task = self.board.task("Training: step", state.max_steps, self._status(state))
        self.task.update(completed=state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        if self.task is None:
            return
        now = time.monotonic()
        self._fields["s/step"] = f"{now - self._last:.1f} s/step"
        self._last = now
        self.task.update(completed=state.global_step, status=self._status(state))

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.show(logs, state)  # an evaluation's (eval_accuracy), the Trainer's periodic log

    def show(self, logs: dict[str, float] | None, state) -> None:
        """Metrics on the line: a step's (reward, KL; `MetricsJsonlCallback`, every step) or an
        evaluation's."""
        if self.task is None or not logs:
            return
        for key, fmt in self.LOGGED:
            if logs.get(key) is not None:
                self._fields[key] = fmt.format(logs[key])
        outcomes = outcome_summary(logs)
        if outcomes:
            self._fields["outcomes"] = outcomes
        self.task.update(status=self._status(state))

    def _status(self, state) -> str:
        parts = [self._fields[key] for key, _ in self.LOGGED if key in self._fields]
        parts += [self._fields[key] for key in ("outcomes", "s/step") if key in self._fields]
        done = state.global_step - self._first_step
        if 0 < done and state.global_step < state.max_steps:
            pace = (time.monotonic() - self._begin) / done
            parts.append(f"{format_duration(pace * (state.max_steps - state.global_step))} left")
        return ", ".join(parts)

    @contextmanager
    def evaluation(self, label: str, total: int | None) -> Iterator[Callable[[int], None]]:
        """A task "label n/total prompts" while a held-out set is evaluated; yields
        `advance(prompts)`. It leaves "label: n prompts in 12.3 s" behind."""
        board = self.board or progress.board()
        task = board.task(label, total, unit=" prompts")
        try:
            yield task.advance
        except BaseException:
            task.finish("")
            raise
        task.finish(f"{label}: {task.completed} prompts in {task.elapsed:.1f} s")

    def on_train_end(self, args, state, control, **kwargs):
        if self.task is not None:
            steps = state.global_step - self._first_step
            took = format_duration(time.monotonic() - self._begin)
            self.task.update(completed=state.global_step, status=self._status(state))
            self.task.finish(
                f"Training: step {state.global_step}/{state.max_steps} ({steps} "
                f"steps in {took}), {self._status(state)}".rstrip(", ")
            )
            self.task = None


class SyncRefModelCallback(TrainerCallback):
    """`sync_ref_model`: every `ref_model_sync_steps` optimizer steps, move the frozen reference
    towards the policy (`policy.mix_reference`, TR-DPO). Each process updates its own copy of
    the reference from the same (synchronised) policy weights."""

    def __init__(self, ref_model, alpha: float, every: int) -> None:
        self.ref_model, self.alpha, self.every = ref_model, alpha, every

    @classmethod
    def from_args(cls, ref_model, args, accelerator=None) -> SyncRefModelCallback:
        if ref_model is None:
            raise ValueError(
                "sync_ref_model=True needs a separate reference model, and a PEFT policy's "
                "reference is its base with the adapter off; train without peft_config or set "
                "sync_ref_model=False."
            )
        if getattr(accelerator, "is_fsdp2", False):
            raise ValueError(
                "sync_ref_model=True is not supported under FSDP (the policy's weights are "
                "sharded, the reference's are not); use DDP or set sync_ref_model=False."
            )
        return cls(ref_model, args.ref_model_mixup_alpha, args.ref_model_sync_steps)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        from ..models.policy import mix_reference

        if model is not None and state.global_step % self.every == 0:
            mix_reference(self.ref_model, model, self.alpha)


def _progress_callback(trainer: Any) -> RunProgressCallback | None:
    """The trainer's progress callback on the main process with progress on, else None."""
    bars = [c for c in trainer.callback_handler.callbacks if isinstance(c, RunProgressCallback)]
    return bars[0] if bars and trainer.is_world_process_zero() else None


def evaluation_progress(trainer: Any, label: str, total: int | None):
    """A context yielding `advance(prompts)` that moves an evaluation task on the progress board
    (on the main process with progress on: `disable_tqdm=False`), else a no-op."""
    shown = _progress_callback(trainer)
    return nullcontext(lambda n: None) if shown is None else shown.evaluation(label, total)


def trainer_phase(trainer: Any, label: str):
    """A context showing one phase of the trainer's run (saving, writing the report) on the
    progress board as `progress.phase` does; nothing when progress is off."""
    shown = _progress_callback(trainer)
    return progress.phase(label, enabled=shown is not None)
