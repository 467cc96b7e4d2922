"""Around `GRPOTrainer.train()`: the run directory claimed, a resume made exact, a signal turned
into a checkpoint, checkpoints written atomically.

    train(resume_from_checkpoint)
      check_shared         several processes: every one sees the same output_dir (shared_dir.py)
      resolve_resume       a path or True -> the newest complete checkpoint, every file of it
                           read and found whole (checkpoints.py, integrity.py)
      resume.prepare       every piece of an exact resume there, the config the same run's
                           (or `resume_as_new_phase`), the run's record for the checkpoints
      run_lock.claim       lock output_dir; refuse a rerun that neither resumes nor overwrites,
                           and a folder holding files no run wrote (ownership.py); process 0
                           alone, its refusal raised on every process
      plan_batch           auto_find_batch_size: the micro-batch that fits (autopilot.py),
                           applied by the trainer through the config's batch-size checks
      cpu_memory.prepare   (engine/memory.py) cpu_memory_reuse: malloc keeps freed memory, LM-head chunks < 32 MB
      handlers_installed   SIGTERM / Ctrl-C -> save and stop (preemption.py)
      Trainer.train        (its `_save_checkpoint` goes through `save_checkpoint` below;
                           `skip_when_done`: a checkpoint at max_steps trains no further step)
        after_load         once weights, optimizer, scheduler and run state are loaded: what
                           the run folder recorded after the checkpoint's step is set aside
                           (timeline.py); nothing in the run folder changed before
      a full disk          one line naming the file and the intact checkpoints

How it differs from `transformers.Trainer`: there, `resume_from_checkpoint` restores weights,
optimizer, scheduler and RNG states; here also the trainer's own state (`run/state.py`), so a run
resumed from checkpoint k continues exactly as the uninterrupted run would (the rollout buffer
when a rollout spans the checkpoint, the metrics window, the zero-std streak, ...).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..distributed import on_main_process
from ..engine import memory as cpu_memory
from . import checkpoints, timeline
from . import lock as run_lock
from . import resume as resume_checks
from .preemption import PreemptionCallback, TrainingInterrupted, handlers_installed
from .shared_dir import check_shared

logger = logging.getLogger(__name__)


def train(trainer: Any, base_train: Callable[..., Any], resume: str | bool | None, **kwargs):
    """`Trainer.train` (`base_train`) wrapped in the steps above; returns its output, or raises
    `TrainingInterrupted` after a signal (the checkpoint is saved)."""
    a = trainer.args
    if resume is None and a.resume_from_checkpoint:  # honoured, not silently ignored
        resume = a.resume_from_checkpoint
    check_shared(a.output_dir, trainer.accelerator)  # before any process reads or writes it
    checkpoint = checkpoints.resolve_resume(a.output_dir, resume)
    resume_checks.prepare(trainer, checkpoint)  # every piece there, the same run (resume.py)
    main = trainer.is_world_process_zero()
    # the earlier run's files as found when the trainer was built (not its own writes)
    found, resuming = trainer.previous_run_files, checkpoint is not None
    others_ok = a.allow_other_files_in_output_dir

    def claim() -> None:
        overwrite = a.overwrite_output_dir
        run_lock.claim(
            a.output_dir, resume=resuming, overwrite=overwrite, found=found, others_ok=others_ok
        )

    on_main_process(trainer.accelerator, claim)
    try:
        if a.auto_find_batch_size:  # before the first step (autopilot.py)
            trainer.plan_batch(checkpoint)
        # after the autopilot's chunk: it may cut it further
        cpu_memory.prepare(a, trainer.model, trainer.engine.levers)
        guard = PreemptionCallback(trainer.accelerator)
        trainer.add_callback(guard)
        try:
            with handlers_installed(guard):
                output = base_train(resume_from_checkpoint=checkpoint, **kwargs)
        except Exception as err:  # a full disk (OSError, torch's or safetensors' own): one line
            if not checkpoints.no_space(err) or isinstance(err, checkpoints.CheckpointWriteError):
                raise
            raise checkpoints.space_error(err, a.output_dir) from err
        finally:
            trainer.resume_plan.stop_clock()
            trainer.remove_callback(guard)
    finally:
        if main:
            run_lock.release(a.output_dir)
    if guard.signum is not None:
        raise TrainingInterrupted(guard.signum, trainer.state.global_step, _newest(a.output_dir))
    return output


def after_load(trainer: Any, checkpoint: str | None) -> None:
    """Once the Trainer loaded weights, optimizer and scheduler: the trainer's `RunState`, then
    (the checkpoint loaded whole) what the run folder recorded after its step is set aside
    (`timeline.py`). Nothing in the run folder changes before, so a resume that fails to load
    loses nothing."""
    state = checkpoints.load_state(checkpoint, trainer.args.process_index)
    if state is not None:
        trainer.run_state.load_state_dict(state, trainer.args.device)
    if checkpoint is not None and trainer.is_world_process_zero():
        timeline.set_aside(trainer.args.output_dir, checkpoints.checkpoint_step(checkpoint) or 0)


def skip_when_done(state: Any, epochs: int, steps: int, num_epochs: int) -> tuple[int, int]:
    """`Trainer._init_training_state`'s (epochs trained, steps into the epoch), or "every epoch
    done" when a resumed run's checkpoint is already at or past `max_steps`.

    transformers 5.24 checks `max_steps` only after an optimizer step, so resuming from the last
    checkpoint (a SIGTERM during the final evaluation, or a finished run resumed again) trained
    one step more than the uninterrupted run, and every further resume one more.
    """
    if state.max_steps > 0 and state.global_step >= state.max_steps:
        logger.warning(
            "The checkpoint is at step %d and max_steps=%d: nothing is left to train (raise "
            "max_steps to train further).",
            state.global_step,
            state.max_steps,
        )
        return num_epochs, 0
    return epochs, steps


def _newest(output_dir: str) -> str | None:
    found = checkpoints.latest_complete(output_dir)
    return str(found) if found is not None else None


def save_checkpoint(
    trainer: Any, save_staged: Callable[[str], None], push: Callable[[str], None]
) -> None:
    """Write `checkpoint-<step>` atomically: `save_staged(staging_dir)` (the Trainer's own
    saving, redirected there by the trainer), then the trainer's `RunState`, then rename; with
    `push_to_hub`, `push(folder)` (the Trainer's push) from the renamed folder."""
    run_dir = trainer.args.output_dir
    pushing = trainer.args.push_to_hub  # pushed once renamed, from its final folder

    def write(staged: Path) -> None:
        save_staged(str(staged.parent))
        _fix_best_checkpoint(trainer.state, staged.parent, Path(run_dir))
        trainer.save_run_state(staged)
        if trainer.is_world_process_zero():
            trainer.state.save_to_json(str(staged / checkpoints.TRAINER_STATE))
            record = trainer.resume_plan.saved_record()  # None: saved outside train()
            if record is not None:
                resume_checks.save_record(staged, record)

    acc, main = trainer.accelerator, trainer.is_world_process_zero()
    step = trainer.state.global_step
    final = checkpoints.write_atomically(run_dir, step, write, main, acc.wait_for_everyone)
    if pushing:
        push(str(final))
    if main:
        _rotate(run_dir, trainer.args.save_total_limit, trainer.state.best_model_checkpoint)
    acc.wait_for_everyone()


def _fix_best_checkpoint(state: Any, staging: Path, run_dir: Path) -> None:
    """The Trainer records the best checkpoint (in its `TrainerState`) under the folder it wrote
    to: point it home."""
    best = state.best_model_checkpoint
    if best and str(best).startswith(str(staging)):
        state.best_model_checkpoint = str(run_dir / Path(best).name)


def _rotate(run_dir: str, save_total_limit: int | None, best: str | None) -> None:
    """Delete the oldest checkpoints beyond `save_total_limit`, keeping the `best` one."""
    from transformers.trainer_utils import rotate_checkpoints

    rotate_checkpoints(
        output_dir=run_dir,
        save_total_limit=save_total_limit,
        best_model_checkpoint=best,
        use_mtime=False,
    )
