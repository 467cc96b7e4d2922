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

logger = logging.getLogger(__name__)

STAGING_DIR = ".checkpoint-staging"
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
    """A checkpoint could not be written; earlier checkpoints are untouched."""


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
    """Every `checkpoint-N` folder, oldest first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and checkpoint_step(p) is not None]
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
    """`resume_from_checkpoint` (a path, True/"true", or None/False) -> a complete checkpoint.

    Raises ValueError (one line, with the fix) when there is nothing complete to resume from.
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
        return str(latest_complete(output_dir))
    folder = Path(value)
    if not folder.is_dir():
        raise ValueError(
            f"resume_from_checkpoint={value!r}: no such folder; give a checkpoint-N folder of "
            "the run, or `true` for its newest complete checkpoint."
        )
    missing = missing_files(folder)
    if missing:
        raise ValueError(
            f"resume_from_checkpoint={value!r} is incomplete (no {' and no '.join(missing)}): it "
            "was being written when the run stopped; use `true` to take the newest complete one."
        )
    return str(folder)


# --- writing one atomically ----------------------------------------------------------------------
def staging_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / STAGING_DIR


def _no_space(err: BaseException) -> bool:
    text = str(err)
    return (
        getattr(err, "errno", None) == errno.ENOSPC
        or "No space left" in text
        or "unexpected pos" in text  # torch's zip writer on a full disk (torch 2.x)
        or "PytorchStreamWriter failed" in text
    )


def _space_error(err: BaseException, run_dir: Path, name: str) -> CheckpointWriteError:
    free_mb = shutil.disk_usage(run_dir).free / 2**20
    kept = [p.name for p in checkpoints(run_dir)] or ["none yet"]
    return CheckpointWriteError(
        f"Could not write {name} in {run_dir}: no space left on the device ({free_mb:.0f} MB "
        f"free). Earlier checkpoints are intact ({', '.join(kept)}); free some space or set "
        "save_total_limit, then resume with resume_from_checkpoint=true."
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
        if isinstance(err, (OSError, RuntimeError)) and _no_space(err):
            raise _space_error(err, run_dir, name) from err
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
    "remove_staging",
    "resolve_resume",
    "save_state",
    "staging_root",
    "write_atomically",
]
