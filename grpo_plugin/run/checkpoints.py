"""Checkpoints that are either complete or invisible, and the state that makes a resume exact.

    output_dir/
      checkpoint-N/                 visible only once complete (renamed into place)
        trainer_state.json, adapter or model weights, optimizer.pt, scheduler.pt, rng_state*.pth
        grpo_state_<process>.pt      STATE_FILE: this trainer's own state (below)
        grpo_resume.json             resume.RECORD_FILE: what the run is (its config, model,
                                     rewards, data), compared on resume (resume.py)
      .checkpoint-staging/           STAGING_DIR: where checkpoint-N is written first

How it differs from `transformers.Trainer`: the Trainer writes `checkpoint-N/` in place, so a
kill or a full disk leaves a half-written folder that `resume_from_checkpoint=True` then picks
and fails on. Here the Trainer's own saving writes into the staging folder, and the folder is
renamed to `checkpoint-N` only when every file is there. Resuming with `True` takes the newest
*complete* checkpoint (it has `trainer_state.json` and weights); older half-written folders
are skipped with a warning.

The trainer's own state (`grpo_state_<process>.pt`) holds what decides the rest of the run besides
the weights, the optimizer and the RNG states (which the Trainer saves): a rollout buffer still
being trained on (`steps_per_generation` or `num_iterations` > 1), its loss normaliser, the
zero-std streak, the metrics window, the adaptive entropy coefficient, the reward-hacking alarm's
state and, with `sync_ref_model`, the reference weights. The sampling draws need nothing: they are
keyed on (seed, rollout, prompt) (`rollout/noise.py`).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from . import integrity, pending, rundir

logger = logging.getLogger(__name__)

STAGING_DIR = rundir.STAGING_DIR
STATE_FILE = "grpo_state_{process}.pt"
TRAINER_STATE = "trainer_state.json"  # transformers' TRAINER_STATE_NAME
WEIGHT_FILES = (
    "adapter_model.safetensors",
    "model.safetensors",
    "model.safetensors.index.json",
    "adapter_model.bin",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
_CHECKPOINT = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")
_TRUE = {"true", "True", "TRUE", "last", "latest"}


class CheckpointWriteError(RuntimeError):
    """A checkpoint (or another file of the run) could not be written, e.g. on a full disk;
    earlier checkpoints are untouched. The message is one line that says how to go on."""


# --- which checkpoint ----------------------------------------------------------------------------
def checkpoint_step(path: str | Path) -> int | None:
    match = _CHECKPOINT.match(Path(path).name)
    return int(match.group(1)) if match else None


def missing_files(folder: Path) -> list[str]:
    """What a checkpoint folder lacks to be resumable ([] when complete)."""
    missing = [] if (folder / TRAINER_STATE).is_file() else [TRAINER_STATE]
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        missing.append("model or adapter weights")
    return missing


def checkpoints(output_dir: str | Path) -> list[Path]:
    """Every `checkpoint-N` folder, oldest first; not those a recorded change of the folder takes
    out of it (`pending.py`: a set-aside timeline, a cleared run, cut short by a kill)."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    leaving = pending.leaving(root)
    found = [
        p
        for p in root.iterdir()
        if p.is_dir() and checkpoint_step(p) is not None and p.name not in leaving
    ]
    return sorted(found, key=checkpoint_step)


def has_complete(output_dir: str | Path) -> bool:
    """Whether any checkpoint-N folder can be resumed from (quietly: no warnings)."""
    return any(not missing_files(folder) for folder in checkpoints(output_dir))


def latest_complete(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint; half-written newer ones are skipped with a warning."""
    for folder in reversed(checkpoints(output_dir)):
        missing = missing_files(folder)
        if not missing:
            return folder
        logger.warning(
            "Skipping %s: it is incomplete (no %s), probably written when a run was stopped.",
            folder,
            " and no ".join(missing),
        )
    return None


def resolve_resume(output_dir: str | Path, value: str | bool | None) -> str | None:
    """`resume_from_checkpoint` (a path, True/"true", or None/False) -> a complete checkpoint,
    every file of it read and found whole (`integrity.py`), and the run's JSON files readable.

    Raises ValueError (one line, with the fix) when there is nothing complete to resume from, or
    when a file is damaged: before anything in the run folder changes.
    """
    if value is None or value is False or value == "":
        return None
    if value is True or (isinstance(value, str) and value in _TRUE):
        if not has_complete(output_dir):  # the one way out, the one check_rerun gives too
            raise ValueError(
                f"resume_from_checkpoint=true, but {output_dir} has no complete checkpoint-N "
                "folder to resume (the run stopped before one was saved); start over with "
                "--overwrite_output_dir instead of --resume_from_checkpoint, or choose another "
                "output_dir."
            )
        folder = latest_complete(output_dir)
    else:
        folder = Path(value)
        if not folder.is_dir():
            raise ValueError(
                f"resume_from_checkpoint={value!r}: no such folder; give a checkpoint-N folder of "
                "the run, or `true` for its newest complete checkpoint."
            )
        missing = missing_files(folder)
        if missing:
            raise ValueError(
                f"resume_from_checkpoint={value!r} is incomplete (no {' and no '.join(missing)}): "
                "it was being written when the run stopped; use `true` to take the newest "
                "complete one."
            )
    _check_not_abandoned(output_dir, folder)
    integrity.check_folder(folder, _fix_for(folder))
    _check_run_files(output_dir)
    return str(folder)


def _check_not_abandoned(output_dir: str | Path, folder: Path) -> None:
    root = Path(output_dir).resolve()
    change = pending.read(root) if folder.resolve().parent == root else None
    if change is not None and folder.name in pending.leaving(root):  # a kill cut it short
        if change.get("change") == "clear":
            raise ValueError(
                f"resume_from_checkpoint={str(folder)!r} was being deleted (overwrite_output_dir, "
                f"stopped half way; the next start finishes it): start over in {output_dir}, or "
                "choose another output_dir."
            )
    elif root / rundir.ABANDONED_DIR not in folder.resolve().parents:
        return
    raise ValueError(
        f"resume_from_checkpoint={str(folder)!r} belongs to a timeline an earlier resume set "
        f"aside; resume from a checkpoint-N of {output_dir}, or continue that timeline in "
        "another output_dir (give the same checkpoint path there)."
    )


def _fix_for(folder: Path) -> str:
    """How to go on from a damaged checkpoint: the newest earlier whole one, or start over."""
    step = checkpoint_step(folder) or 0
    for other in reversed(checkpoints(folder.parent)):
        earlier = (checkpoint_step(other) or 0) < step
        if earlier and not missing_files(other) and integrity.first_damaged(other) is None:
            return (
                "restore the file from a copy, or resume from the earlier whole checkpoint with "
                f"--resume_from_checkpoint {other}."
            )
    return "restore the file from a copy, or start over with --overwrite_output_dir."


def _check_run_files(output_dir: str | Path) -> None:
    """The run's JSON files a resume reads (or sets aside) must parse."""
    for name in (rundir.RUN_INFO_FILE, rundir.EVAL_FILE):
        path = Path(output_dir) / name
        problem = integrity.damage(path) if path.is_file() else None
        if problem is not None:
            raise integrity.DamagedCheckpoint(
                f"{path} is damaged: {problem}. Nothing was changed; fix or delete it, then resume."
            )


# --- writing one atomically ----------------------------------------------------------------------
def staging_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / STAGING_DIR


def no_space(err: BaseException) -> bool:
    """Whether `err` is a full disk (or quota), however the writer said it."""
    text = str(err)
    return (
        getattr(err, "errno", None) in (errno.ENOSPC, errno.EDQUOT)
        or "No space left" in text
        or "unexpected pos" in text  # torch's zip writer on a full disk (torch 2.x)
        or "PytorchStreamWriter failed" in text
    )


def space_error(
    err: BaseException, run_dir: str | Path, name: str | None = None
) -> CheckpointWriteError:
    """One line for a full disk: what could not be written, the free space, the checkpoints that
    are intact, and how to go on."""
    run_dir = Path(run_dir)
    name = name or getattr(err, "filename", None) or "the run's files"
    try:
        free = f"{shutil.disk_usage(run_dir).free / 2**20:.0f} MB free"
    except OSError:
        free = "free space unknown"
    kept = [p.name for p in checkpoints(run_dir)] or ["none yet"]
    return CheckpointWriteError(
        f"Could not write {name} in {run_dir}: no space left on the device ({free}). Saved "
        f"checkpoints are intact ({', '.join(kept)}); free some space or set save_total_limit, "
        "then resume with --resume_from_checkpoint true."
    )


def write_atomically(
    run_dir: str | Path,
    step: int,
    write: Callable[[Path], None],
    is_main: bool,
    barrier: Callable[[], None],
) -> Path:
    """Write `checkpoint-<step>` with `write(staging_folder)`, then rename it into place.

    Every process calls this (each writes its own files into the staging folder); the main one
    renames. A failure removes the staging folder and leaves the existing checkpoints alone.
    """
    run_dir = Path(run_dir)
    name = f"{PREFIX_CHECKPOINT_DIR}-{step}"
    staged, final = staging_root(run_dir) / name, run_dir / name
    if is_main:
        shutil.rmtree(staged, ignore_errors=True)
    barrier()
    try:
        write(staged)
        barrier()
        if is_main:
            _replace_dir(staged, final)
    except BaseException as err:
        if is_main:
            shutil.rmtree(staged, ignore_errors=True)
            _remove_if_empty(staged.parent)
        if isinstance(err, (OSError, RuntimeError)) and no_space(err):
            raise space_error(err, run_dir, name) from err
        raise
    barrier()
    return final


def _replace_dir(staged: Path, final: Path) -> None:
    """Rename `staged` to `final`; an older folder of that name (a stale or half-written
    checkpoint of the same step) is moved aside first and deleted after."""
    old = staged.with_name(staged.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(staged, final)
    shutil.rmtree(old, ignore_errors=True)
    _remove_if_empty(staged.parent)


def _remove_if_empty(folder: Path) -> None:
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


def remove_staging(run_dir: str | Path) -> None:
    """Left over by a run that was killed while writing a checkpoint."""
    shutil.rmtree(staging_root(run_dir), ignore_errors=True)


# --- the trainer's own state ---------------------------------------------------------------------
def save_state(folder: Path, process: int, state: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(state, folder / STATE_FILE.format(process=process))


def load_state(folder: str | Path | None, process: int) -> dict[str, Any] | None:
    """What `save_state` wrote for this process; None for a checkpoint without it (an older
    version, or another trainer's)."""
    if folder is None:
        return None
    path = Path(folder) / STATE_FILE.format(process=process)
    if not path.is_file():
        logger.warning("%s has no %s: the run resumes without it (not exactly).", folder, path.name)
        return None
    return torch.load(path, map_location="cpu", weights_only=True)


__all__ = [
    "CheckpointWriteError",
    "checkpoint_step",
    "checkpoints",
    "latest_complete",
    "load_state",
    "missing_files",
    "no_space",
    "remove_staging",
    "resolve_resume",
    "save_state",
    "space_error",
    "staging_root",
    "write_atomically",
]
