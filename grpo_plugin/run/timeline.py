"""One timeline per run folder: a resume from checkpoint-k sets aside what came after step k.

    later        what the run folder recorded after step k
    set_aside    move it into `abandoned/after-step-k-<time>/` (never deleted), once the
                 checkpoint has been loaded whole (`lifecycle.after_load`); the move is recorded
                 first (`pending.py`), and a kill half way is finished by the next start
                 (`finish`, from `lock.claim`), so the folder never holds two half timelines

What comes after step k: the checkpoints of later steps (a resume from an earlier checkpoint, on
purpose or after a kill), `metrics.jsonl`'s lines after step k (and the end-of-training summary
of step k), the completions tables of rollouts sampled at step k or later (a table is named by
the step its rollout started from), and, when the run had been saved at a later step, its final
outputs (weights, `grpo_run.json`, the card, the curve, `recipe.yaml`, `eval.json`; of eval.json
the evaluation before training stays: it is the same for both timelines).

So `metrics.jsonl` tells one continuous history, `--resume_from_checkpoint true` can never pick a
checkpoint of the abandoned timeline (it looks only at `output_dir/checkpoint-N`), and nothing is
lost: the set-aside folder holds the abandoned records, `metrics.jsonl` and `completions/` laid
out as in a run folder. A leftover `.checkpoint-staging/` (a kill while saving) is a half-written
checkpoint, not a record: it is deleted.

How it differs from `transformers.Trainer`: there a resume from checkpoint-2 of a run that
reached checkpoint-4 keeps checkpoint-4, and `resume_from_checkpoint=True` later picks it (the
abandoned timeline) without a word.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import checkpoints, pending, rundir

logger = logging.getLogger(__name__)

FINAL_OUTPUTS = (
    rundir.CARD_FILE,
    rundir.CURVE_FILE,
    rundir.RECIPE_FILE,
    rundir.RUN_INFO_FILE,
) + rundir.WEIGHT_OUTPUTS


@dataclass
class Later:
    """What a run folder recorded after step `step` (names relative to the run folder)."""

    step: int
    checkpoints: list[Path] = field(default_factory=list)
    metric_lines: list[str] = field(default_factory=list)
    kept_lines: list[str] = field(default_factory=list)
    tables: list[Path] = field(default_factory=list)
    finals: list[Path] = field(default_factory=list)  # final outputs of a later save
    final_step: int | None = None  # the step those outputs describe
    eval_file: Path | None = None  # eval.json of a later save

    def __bool__(self) -> bool:
        return bool(self.checkpoints or self.metric_lines or self.tables or self.finals)

    def described(self) -> str:
        parts = [", ".join(p.name for p in self.checkpoints)] if self.checkpoints else []
        if self.metric_lines:
            parts.append(f"{len(self.metric_lines)} line(s) of {rundir.METRICS_FILE}")
        if self.tables:
            parts.append(f"{len(self.tables)} completions table(s)")
        if self.finals:
            parts.append(f"the outputs saved at step {self.final_step}")
        return ", ".join(parts)


def _saved_step(output_dir: Path) -> int | None:
    """The step the top-level outputs describe (`grpo_run.json`'s `global_step`)."""
    info = rundir.read_json(output_dir / rundir.RUN_INFO_FILE)
    return info.get("global_step") if isinstance(info, dict) else None


def later(output_dir: str | Path, step: int) -> Later:
    """What `output_dir` recorded after step `step`."""
    root = Path(output_dir)
    found = Later(step)
    found.checkpoints = [p for p in checkpoints.checkpoints(root) if checkpoint_after(p, step)]
    found.kept_lines, found.metric_lines = rundir.split_metrics(root, step)
    tables = root / rundir.COMPLETIONS_DIR
    for table in sorted(tables.iterdir()) if tables.is_dir() else ():
        at = rundir.completion_step(table)
        if at is not None and at >= step:
            found.tables.append(table)
    saved = _saved_step(root)
    if saved is not None and saved > step:
        found.final_step = saved
        found.finals = [root / n for n in FINAL_OUTPUTS if (root / n).exists()]
        eval_file = root / rundir.EVAL_FILE
        found.eval_file = eval_file if eval_file.is_file() else None
    return found


def checkpoint_after(folder: Path, step: int) -> bool:
    return (checkpoints.checkpoint_step(folder) or 0) > step


def _new_folder(root: Path, step: int) -> Path:
    """A name for the set-aside folder that no earlier resume took (created when it is filled)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = root / rundir.ABANDONED_DIR / f"after-step-{step}-{stamp}"
    folder, n = base, 1
    while folder.exists():
        n += 1
        folder = base.with_name(f"{base.name}-{n}")
    return folder


def _keep_before(root: Path, dest: Path) -> None:
    """Move eval.json aside; the evaluation before training (both timelines') stays. Copied whole
    (renamed into place) before the run's own is cut, and not again once it is there."""
    eval_file = root / rundir.EVAL_FILE
    if not eval_file.is_file():
        return  # cut (or deleted) by the change's first go
    if not (dest / rundir.EVAL_FILE).is_file():
        rundir.write_text_atomic(dest / rundir.EVAL_FILE, eval_file.read_text())
    data = rundir.read_json(eval_file) or {}
    before = {k: data[k] for k in rundir.EVAL_BEFORE_KEYS if k in data}
    if before:
        rundir.write_json(eval_file, before)
    else:
        eval_file.unlink()


def _split_metrics(root: Path, dest: Path, step: int) -> None:
    """metrics.jsonl's lines after `step` written aside whole, then the run's own cut (again: the
    same result; once the aside file is there, the lines after `step` are in it)."""
    aside = dest / rundir.METRICS_FILE
    if not aside.is_file():
        later_lines = rundir.split_metrics(root, step)[1]
        rundir.write_text_atomic(aside, "".join(f"{line}\n" for line in later_lines))
    kept = rundir.split_metrics(root, step)[0]
    rundir.write_text_atomic(root / rundir.METRICS_FILE, "".join(f"{line}\n" for line in kept))


def _carry_out(root: Path, change: dict) -> Path:
    """Do a recorded set-aside (every step can be done again: a move whose source is gone is
    done); returns the set-aside folder."""
    dest = root / change["folder"]
    dest.mkdir(parents=True, exist_ok=True)
    if change.get("metrics"):
        _split_metrics(root, dest, change["step"])
    if change.get("eval"):
        _keep_before(root, dest)
    for name in change["move"]:
        source, target = root / name, dest / name
        if source.exists() or source.is_symlink():
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(source, target)
    return dest


def finish(output_dir: str | Path, change: dict) -> Path:
    """Finish a set-aside that a kill cut short (`pending.py`: the next start does), and say so."""
    root = Path(output_dir)
    dest = _carry_out(root, change)
    pending.done(root)
    names = [name for name in change["move"] if "/" not in name]  # not completions/step_N
    tables = len(change["move"]) - len(names)
    shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
    logger.warning(
        "A resume from step %d was stopped while it set aside what came after that step; "
        "finished: %s%s moved to %s (nothing is deleted).",
        change["step"],
        shown or "the later records",
        f" and {tables} completions table(s)" if tables else "",
        dest,
    )
    return dest


def set_aside(output_dir: str | Path, step: int) -> Path | None:
    """Move what `output_dir` recorded after step `step` into a new `abandoned/` folder and say
    so; returns that folder (None: nothing came after). The change is recorded before any of it
    is done (`pending.py`), so a kill half way is finished by the next start, and copies come
    before cuts: every record stays in at least one place."""
    root = Path(output_dir)
    checkpoints.remove_staging(root)
    earlier = pending.read(root)  # lock.claim finishes one first; here for a direct call
    if earlier is not None and earlier.get("change") == "set_aside":
        finish(root, earlier)
    found = later(root, step)
    if not found:
        return None
    dest = _new_folder(root, step)
    tables = [f"{rundir.COMPLETIONS_DIR}/{p.name}" for p in found.tables]
    change = {
        "change": "set_aside",
        "step": step,
        "folder": str(dest.relative_to(root)),
        "move": tables + [p.name for p in found.checkpoints + found.finals],
        "metrics": bool(found.metric_lines),
        "eval": found.eval_file is not None,
    }
    pending.begin(root, change)
    _carry_out(root, change)
    pending.done(root)
    other_timeline = bool(found.checkpoints or found.finals)  # else: steps a kill cut short
    logger.log(
        logging.WARNING if other_timeline else logging.INFO,
        "Resuming from step %d: what the run folder recorded after it (%s) is moved to %s "
        "(nothing is deleted), so that the run folder holds one timeline.",
        step,
        found.described(),
        dest,
    )
    return dest


__all__ = ["FINAL_OUTPUTS", "Later", "finish", "later", "set_aside"]
