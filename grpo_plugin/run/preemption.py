"""Stop cleanly when asked to: SIGTERM (spot instances, Slurm, `kill`) or a first Ctrl-C.

The signal is noted, the current optimizer step finishes, a checkpoint is saved, and `train()`
raises `TrainingInterrupted`, which says how to resume (the CLI prints it and exits with 128 + the
signal number: 143 for SIGTERM, 130 for Ctrl-C). A second signal aborts at once. On several
processes the step ends on every process as soon as any one of them was signalled (one flag,
reduced across processes at the end of each step), so the checkpoint is saved by all.

Handlers are installed only while `train()` runs, only from the main thread, and the previous
ones are restored afterwards.

Outside the training steps (loading the model, the evaluations before and after training, saving
the final outputs) there is no step to finish: `stop_on_signal` (installed by the recipe pipeline
around a whole run) turns SIGTERM into `RunStopped` at once, which says in one line what was
doing and what is saved (the CLI exits 143). Before, the process died silently with 143.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from transformers import TrainerCallback

from .. import distributed

logger = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class TrainingInterrupted(RuntimeError):
    """Training stopped on a signal after saving a checkpoint; `exit_code` is 128 + signal."""

    def __init__(self, signum: int, step: int, checkpoint: str | None):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        self.exit_code = 128 + signum
        name = signal.Signals(signum).name
        where = f"checkpoint saved to {checkpoint}" if checkpoint else "no checkpoint was saved"
        super().__init__(
            f"Stopped by {name} after step {step}; {where}. Resume with "
            "--resume_from_checkpoint true (or trainer.train(resume_from_checkpoint=True))."
        )


class RunStopped(BaseException):
    """A signal outside the training steps: the run stopped at once; what was saved stays.
    `stage` says what the run was doing, `checkpoint` the newest checkpoint (None: none). A
    BaseException, as KeyboardInterrupt: code that catches `Exception` (a reward's error
    handling, say) lets it through."""

    def __init__(self, signum: int, stage: str = "", checkpoint: str | None = None):
        self.signum, self.stage, self.checkpoint = signum, stage, checkpoint
        self.exit_code = 128 + signum
        during = f" during {stage}" if stage else ""
        saved = f"the run is saved up to {checkpoint}" if checkpoint else "no checkpoint was saved"
        super().__init__(f"Stopped by {signal.Signals(signum).name}{during}; {saved}.")

    def during(self, stage: str, checkpoint: str | None) -> RunStopped:
        """The same stop, saying what the run was doing and what is saved."""
        return RunStopped(self.signum, stage, checkpoint)


@contextmanager
def stop_on_signal(signals: tuple[int, ...] = (signal.SIGTERM,)) -> Iterator[None]:
    """Raise `RunStopped` when one of `signals` arrives while the block runs (main thread only;
    `handlers_installed` takes over during the training steps and hands back after)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame) -> None:
        raise RunStopped(signum)

    previous = {s: signal.signal(s, stop) for s in signals}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class PreemptionCallback(TrainerCallback):
    """Turns a noted signal into "save, then stop" at the end of the current step."""

    def __init__(self, accelerator=None) -> None:
        self.accelerator = accelerator
        self.signum: int | None = None
        self.stopped_at: int | None = None

    def handle(self, signum: int, frame) -> None:
        if self.signum is not None:  # the second signal: abort now
            logger.warning("Second %s: aborting without saving.", signal.Signals(signum).name)
            raise KeyboardInterrupt
        self.signum = signum
        logger.warning(
            "%s received: finishing this step, saving a checkpoint, then stopping (send it "
            "again to abort at once).",
            signal.Signals(signum).name,
        )

    def on_step_end(self, args, state, control, **kwargs):
        signalled = self.signum is not None
        if distributed.any_process(self.accelerator, signalled):
            control.should_save = True
            control.should_training_stop = True
            self.stopped_at = state.global_step
            if self.signum is None:  # another process was signalled
                self.signum = signal.SIGTERM
        return control


@contextmanager
def handlers_installed(callback: PreemptionCallback) -> Iterator[None]:
    """Route SIGTERM and SIGINT to `callback` while the block runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, callback.handle) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
