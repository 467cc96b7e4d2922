"""Trainer callbacks: one rich progress bar and `metrics.jsonl`; TR-DPO reference syncing.

The Trainer's own tqdm bar and its dict-printing callback are replaced by `RichProgressCallback`,
which shows step, reward, KL and seconds per step on a single line, and a second line with the
prompts evaluated while a held-out set is evaluated (during training, and before and after it in
the recipe pipeline).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from .run.rundir import append_metrics


def replace_default_callbacks(trainer: Any) -> None:
    """The Trainer's printer and tqdm bar out; metrics.jsonl and the rich progress bar in."""
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    bar = None if trainer.args.disable_tqdm else RichProgressCallback()
    trainer.add_callback(MetricsJsonlCallback(trainer.step_log, bar))
    if bar is not None:
        trainer.add_callback(bar)


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
                self.bar.show(record)

    def on_log(self, args, state, control, logs=None, **kwargs):
        periodic = logs and "loss" in logs and "train_runtime" not in logs
        if state.is_world_process_zero and logs and not periodic:
            append_metrics(args.output_dir, state.global_step, logs)


class RichProgressCallback(TrainerCallback):
    """One progress bar per run: step, mean reward, KL and seconds per optimizer step."""

    def __init__(self) -> None:
        self.progress = None
        self.task = None
        self._last = 0.0
        # Preformatted strings: KL stays "-" when beta == 0 (no reference, nothing to show).
        self._fields = {"reward": "-", "kl": "-", "sps": "-"}

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        self.progress.start()
        self.task = self.progress.add_task("GRPO", total=state.max_steps, status=self._status())
        self.progress.update(self.task, completed=state.global_step)
        self._last = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self.progress is None:
            return
        now = time.perf_counter()
        self._fields["sps"] = f"{now - self._last:.1f}"
        self._last = now
        self.progress.update(self.task, completed=state.global_step, status=self._status())

    def show(self, logs: dict[str, float]) -> None:
        """A step's metrics (reward, KL) on the bar (`MetricsJsonlCallback`, every step)."""
        if self.progress is None or not logs:
            return
        for key, fmt in (("reward", "{:.3f}"), ("kl", "{:.4f}")):
            if logs.get(key) is not None:
                self._fields[key] = fmt.format(logs[key])
        self.progress.update(self.task, status=self._status())

    def _status(self) -> str:
        f = self._fields
        return f"reward {f['reward']}  kl {f['kl']}  {f['sps']} s/step"

    @contextmanager
    def evaluation(self, label: str, total: int | None) -> Iterator[Callable[[int], None]]:
        """A line "label n/total" while a held-out set is evaluated; yields `advance(prompts)`.
        On the training bar while it is live (evaluation during training), else on its own."""
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        own = None
        if self.progress is None:
            columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn())
            own = Progress(*columns, console=Console(stderr=True), transient=True)
            own.start()
        bar = own or self.progress
        task = bar.add_task(label, total=total, status="")
        try:
            yield lambda n: bar.advance(task, n)
        finally:
            bar.remove_task(task)
            if own is not None:
                own.stop()

    def on_train_end(self, args, state, control, **kwargs):
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


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
        from .policy import mix_reference

        if model is not None and state.global_step % self.every == 0:
            mix_reference(self.ref_model, model, self.alpha)


def evaluation_progress(trainer: Any, label: str, total: int | None):
    """A context yielding `advance(prompts)` that moves an evaluation line on the trainer's rich
    progress bar (on the main process with progress bars on), else a no-op."""
    bars = [c for c in trainer.callback_handler.callbacks if isinstance(c, RichProgressCallback)]
    if not bars or not trainer.is_world_process_zero():
        return nullcontext(lambda n: None)
    return bars[0].evaluation(label, total)
