"""Which entries of an output_dir a run wrote, and which are the user's (never written over).

    run_entries      the entries a run of grpo-plugin wrote (names from `rundir`)
    shows_run        whether the folder holds a run (a checkpoint, or a run file that reads as ours)
    others           the entries no run wrote, and those of them a run would write over
    check_others     refuse (one line) a folder holding files no run wrote

An entry is a run's when its name is one a run writes (`rundir.RUN_OUTPUTS`, `SAVED_BESIDE`,
`checkpoint-N`, the lock, the staging and `abandoned/` folders) and, for the names a user's own
project may well hold too, its content says so: `README.md` is our model card (or the one PEFT
writes with an adapter), `recipe.yaml` starts with our header, `report.html` with our comment,
`eval.json`, `grpo_run.json` and `metrics.jsonl` hold what we write there. Names such as `config.json` or `tokenizer.json` count as
a run's only in a folder that holds a run. A folder of one's own model or project is therefore
never taken for a run, and `overwrite_output_dir` deletes only what a run wrote.
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

from . import rundir
from .checkpoints import checkpoint_step

IGNORED = frozenset({".DS_Store", "Thumbs.db", "desktop.ini"})  # written by file browsers
_ALWAYS = (rundir.COMPLETIONS_DIR, rundir.STAGING_DIR, rundir.LOCK_FILE, rundir.ABANDONED_DIR)
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


def shows_run(output_dir: str | Path) -> bool:
    """Whether `output_dir` holds a run: a checkpoint-N folder, or a run file that reads as ours."""
    root = Path(output_dir)
    if not root.is_dir():
        return False
    for name in rundir.RUN_MARKERS:
        path = root / name
        if path.exists() and (path.is_dir() or _reads_as_ours(path)):
            return True
    return any(_is_checkpoint(p) for p in root.iterdir())


def _named_by_a_run(name: str) -> bool:
    """Whether a run writes an entry of this name (whoever wrote the one that is there)."""
    if name in rundir.RUN_OUTPUTS or name in _ALWAYS or checkpoint_step(name) is not None:
        return True
    return any(fnmatch.fnmatch(name, pattern) for pattern in rundir.SAVED_BESIDE)


def _is_runs(path: Path, in_run: bool) -> bool:
    name = path.name
    if not _named_by_a_run(name):
        return False
    if name in _ALWAYS or _is_checkpoint(path):
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
    return sorted(p.name for p in root.iterdir() if _is_runs(p, in_run))


def others(output_dir: str | Path) -> tuple[list[str], list[str]]:
    """(the entries of `output_dir` no run wrote, those of them whose name a run writes), sorted."""
    root = Path(output_dir)
    if not root.is_dir():
        return [], []
    ours = set(run_entries(root))
    found = sorted(p.name for p in root.iterdir() if p.name not in ours and p.name not in IGNORED)
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


__all__ = ["IGNORED", "check_others", "others", "run_entries", "shows_run"]
