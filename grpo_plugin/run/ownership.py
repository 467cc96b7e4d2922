"""Which entries of an output_dir a run wrote, and which are the user's (never written over).

    run_entries      the entries a run of grpo-plugin wrote (names from `rundir`)
    shows_run        whether the folder holds a run (a checkpoint, or a run file that reads as ours)
    others           the entries no run wrote, and those of them a run would write over
    check_others     refuse (one line) a folder holding files no run wrote
    check_links      refuse (one line) a symbolic link under a name a run writes

An entry is a run's when its name is one a run writes (`rundir.RUN_OUTPUTS`, `SAVED_BESIDE`,
`checkpoint-N`, the lock, the staging and `abandoned/` folders) and, for the names a user's own
project may well hold too, its content says so: `README.md` is our model card (or the one PEFT
writes with an adapter), `recipe.yaml` starts with our header, `report.html` with our comment,
`eval.json`, `grpo_run.json` and `metrics.jsonl` hold what we write there. Names such as `config.json` or `tokenizer.json` count as
a run's only in a folder that holds a run. A folder of one's own model or project is therefore
never taken for a run, and `overwrite_output_dir` deletes only what a run wrote. A file being
written (`rundir.temporary_path`: `.NAME-<pid>-<hex>`) is the run's when NAME is; one a kill left
is deleted when a run claims the folder (`lock.claim`). Entries a recorded change of the folder
takes out of it (`pending.py`) are not counted as in it.

A symbolic link under a name a run writes (`checkpoint-12 -> /elsewhere`) is refused: a run moves
and deletes its entries, and what a link points to is not the run's. Links inside the run's own
folders are never followed (a move moves the link, a delete deletes the link).
"""

from __future__ import annotations

import fnmatch
import json
import os
import shlex
from pathlib import Path

from . import pending, rundir
from .checkpoints import checkpoint_step

IGNORED = frozenset({".DS_Store", "Thumbs.db", "desktop.ini"})  # written by file browsers
_ALWAYS = (
    rundir.COMPLETIONS_DIR,
    rundir.STAGING_DIR,
    rundir.LOCK_FILE,
    rundir.ABANDONED_DIR,
    rundir.PENDING_FILE,
)
_CARD_MARKS = ("- grpo-plugin\n", "library_name: peft\n")  # our card's tag; PEFT's own card
_RECIPE_MARK = "# The recipe as run"
_REPORT_MARK = "Written by grpo-plugin"  # report_page.html's opening comment


def _head(path: Path, size: int = 4096) -> str:
    try:
        with path.open("rb") as fh:
            return fh.read(size).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _json_keys(path: Path) -> set[str]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return set()
    return set(data) if isinstance(data, dict) else set()


def _reads_as_ours(path: Path) -> bool:
    """For the names a user's project may hold too: whether the content is what a run writes."""
    name = path.name
    if name == rundir.CARD_FILE:
        head = _head(path)
        return head.startswith("---") and any(mark in head for mark in _CARD_MARKS)
    if name == rundir.RECIPE_FILE:
        return _head(path, 64).startswith(_RECIPE_MARK)
    if name == rundir.EVAL_FILE:
        return bool(_json_keys(path) & {"before", "after", "curve", "train_seconds"})
    if name == rundir.RUN_INFO_FILE:
        return "grpo_plugin_version" in _json_keys(path)
    if name == rundir.REPORT_FILE:
        return _REPORT_MARK in _head(path, 1024)
    if name == rundir.METRICS_FILE:
        first = _head(path, 65536).split("\n", 1)[0]
        try:
            return first == "" or "step" in json.loads(first)
        except (ValueError, TypeError):
            return False
    return True


_CHECKED_BY_CONTENT = frozenset(
    {rundir.CARD_FILE, rundir.RECIPE_FILE, rundir.EVAL_FILE, rundir.RUN_INFO_FILE}
    | {rundir.METRICS_FILE, rundir.REPORT_FILE}
)


def _is_checkpoint(path: Path) -> bool:
    return path.is_dir() and checkpoint_step(path) is not None


def _entries(root: Path) -> list[Path]:
    """The folder's entries, less those a recorded change takes out of it (`pending.py`)."""
    leaving = pending.leaving(root)
    return [p for p in root.iterdir() if p.name not in leaving]


def shows_run(output_dir: str | Path) -> bool:
    """Whether `output_dir` holds a run: a checkpoint-N folder, or a run file that reads as ours."""
    root = Path(output_dir)
    if not root.is_dir():
        return False
    entries = _entries(root)
    for path in entries:
        if path.name in rundir.RUN_MARKERS and (path.is_dir() or _reads_as_ours(path)):
            return True
    return any(_is_checkpoint(p) for p in entries)


def _named_by_a_run(name: str) -> bool:
    """Whether a run writes an entry of this name (whoever wrote the one that is there)."""
    if name in rundir.RUN_OUTPUTS or name in _ALWAYS or checkpoint_step(name) is not None:
        return True
    temporary = rundir.temporary_of(name)
    if temporary is not None:  # a file being written (or one a kill left): as the file it becomes
        return _named_by_a_run(temporary[0])
    return any(fnmatch.fnmatch(name, pattern) for pattern in rundir.SAVED_BESIDE)


def _is_runs(path: Path, in_run: bool) -> bool:
    name = path.name
    if not _named_by_a_run(name):
        return False
    if name in _ALWAYS or _is_checkpoint(path) or rundir.temporary_of(name) is not None:
        return True
    if name in _CHECKED_BY_CONTENT and path.is_file():
        return _reads_as_ours(path) and (in_run or name != rundir.CARD_FILE)
    return in_run  # a generic name (config.json, tokenizer.json, ...): ours in a run's folder


def run_entries(output_dir: str | Path) -> list[str]:
    """The names of the entries of `output_dir` that a run wrote, sorted."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    in_run = shows_run(root)
    return sorted(p.name for p in _entries(root) if _is_runs(p, in_run))


def others(output_dir: str | Path) -> tuple[list[str], list[str]]:
    """(the entries of `output_dir` no run wrote, those of them whose name a run writes), sorted."""
    root = Path(output_dir)
    if not root.is_dir():
        return [], []
    ours = set(run_entries(root))
    names = (p.name for p in _entries(root))
    found = sorted(name for name in names if name not in ours and name not in IGNORED)
    return found, [name for name in found if _named_by_a_run(name)]


def _shown(names: list[str]) -> str:
    return ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")


def check_others(output_dir: str | Path, allowed: bool) -> None:
    """Refuse (ValueError, one line) an output_dir holding files no run wrote: always when a run
    would write over one of them, else unless `allowed` (`allow_other_files_in_output_dir`)."""
    found, clashing = others(output_dir)
    if clashing:
        raise ValueError(
            f"output_dir {output_dir} holds {_shown(clashing)}, which no run of grpo-plugin "
            "wrote and which a run writes (the model card, the recipe as run, the weights, ...): "
            "nothing was written; move the file(s) away, or choose an empty or new output_dir."
        )
    if found and not allowed:
        raise ValueError(
            f"output_dir {output_dir} holds files no run of grpo-plugin wrote ({_shown(found)}): "
            "nothing was written; choose an empty or new output_dir, or pass "
            "--allow_other_files_in_output_dir true to write the run beside them (they are left "
            "alone)."
        )


def check_links(output_dir: str | Path) -> None:
    """Refuse (ValueError, one line) a symbolic link under a name a run writes: a run would move
    or delete it, and what it points to is not the run's. Checked before anything changes."""
    root = Path(output_dir)
    if not root.is_dir():
        return
    for path in sorted(root.iterdir()):
        if path.is_symlink() and _named_by_a_run(path.name):
            raise ValueError(
                f"output_dir {root} holds {path.name}, a symbolic link (to {os.readlink(path)}): "
                "a run folder holds only its own files, and a run moves or deletes its entries; "
                f"nothing was changed. Remove the link (rm {shlex.quote(str(path))}; what it points to is not "
                "touched), or choose another output_dir."
            )


__all__ = ["IGNORED", "check_links", "check_others", "others", "run_entries", "shows_run"]
