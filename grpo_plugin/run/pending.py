"""A change of the run folder that a crash cannot split: recorded first, then done, then the record
removed; the next start into the folder finishes a change it finds recorded.

    output_dir/.grpo-plugin-pending.json     rundir.PENDING_FILE, written whole (renamed into place)
      {"change": "set_aside", "step": k, "folder": "abandoned/after-step-k-<time>",
       "move": [names], "metrics": bool, "eval": bool}          (run/timeline.py)
      {"change": "clear", "remove": [names]}                     (run/lock.py, overwrite_output_dir)

Every step of a recorded change can be done again (a move whose source is gone is done), so
finishing it after a kill ends where the uninterrupted change would have. Until then, what the
change takes out of the folder is already out of it for every reader that decides something:
`checkpoints.checkpoints` (the newest complete checkpoint, "nothing is left to train") and
`ownership.py` (what the folder holds) skip the entries it names (`leaving`).

Only a run that holds the folder's lock begins or finishes one (`lock.claim`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import rundir


def path(output_dir: str | Path) -> Path:
    return Path(output_dir) / rundir.PENDING_FILE


def read(output_dir: str | Path) -> dict[str, Any] | None:
    """The recorded change, None when there is none."""
    record = rundir.read_json(path(output_dir))
    return record if isinstance(record, dict) else None


def begin(output_dir: str | Path, change: dict[str, Any]) -> None:
    """Record `change` before any of it is done (whole or not at all: renamed into place)."""
    rundir.write_json(path(output_dir), change)


def done(output_dir: str | Path) -> None:
    path(output_dir).unlink(missing_ok=True)


def leaving(output_dir: str | Path) -> frozenset[str]:
    """The top-level names the recorded change takes out of the folder (moved or deleted)."""
    root = Path(output_dir)
    if not path(root).is_file():
        return frozenset()
    record = read(root) or {}
    names = record.get("move", []) + record.get("remove", [])
    return frozenset(name for name in names if "/" not in name)  # not completions/step_N


__all__ = ["begin", "done", "leaving", "path", "read"]
