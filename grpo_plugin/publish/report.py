"""`report.html`: one self-contained page per run, read from its run dir (no server, no network).

    grpo_run.json, metrics.jsonl, eval.json, completions/step_*.parquet  ->  report.html

The page (`report_page.html`, filled here) shows the training curve of any logged metric, the
held-out evaluations (before, during, after; the best step), and a browser of the logged
completions by step and by group: each completion with its reward per function, its total and its
advantage, the group's winner first, so a user sees which answers won their group and why.

The data goes into the page as one JSON block; the browser renders one step at a time, so a run of
1,000 steps x 64 completions stays fast (docs/report.md has the measurement). The recipe pipeline
writes the report at the end of a run (`report: false` turns it off); `grpo-plugin report
RUN_DIR` writes it at any time, also while the run trains (the page says so).
"""

from __future__ import annotations

import datetime
import json
import logging
import math
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from ..run import rundir
from ..run.lock import lock_holder

logger = logging.getLogger(__name__)

TEMPLATE = "report_page.html"
DATA_MARK = "/*RUN_DATA*/"
TITLE_MARK = "<!--TITLE-->"
KNOWN_COLUMNS = ("step", "prompt", "completion", "reward", "advantage")
EXTRA_CHARS = 500  # a log_extra value longer than this is cut in the page


class ReportError(ValueError):
    """A run dir the report cannot be written from; one line that says the fix."""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _decoded(value: Any) -> Any:
    """A prompt or completion as logged: chat messages were stored as JSON text (a plain-text
    prompt that happens to parse as JSON stays text)."""
    if isinstance(value, str) and value[:1] == "[":
        try:
            messages = json.loads(value)
        except ValueError:
            return value
        if isinstance(messages, list) and all(isinstance(m, dict) for m in messages):
            return messages
    return value


def metric_columns(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, list]]:
    """metrics.jsonl as columns: `train` (one row per training log) and `eval` (one per
    evaluation), each `{"step": [...], key: [...]}` with None where a row lacks the key."""
    groups: dict[str, list[dict[str, Any]]] = {"train": [], "eval": []}
    for row in rows:
        if "train_runtime" in row:  # the end-of-training summary line
            continue
        kind = "eval" if any(k.startswith("eval_") for k in row) else "train"
        groups[kind].append(row)
    out = {}
    for kind, kept in groups.items():
        keys = sorted({k for r in kept for k, v in r.items() if _number(v) is not None} - {"step"})
        columns: dict[str, list] = {"step": [r["step"] for r in kept]}
        columns.update({k: [_number(r.get(k)) for r in kept] for k in keys})
        out[kind] = columns
    return out


def _group_bounds(prompts: list[Any], group_size: int | None) -> list[tuple[int, int]]:
    """Row ranges of the groups: G consecutive rows with one prompt (a rollout's order), else
    runs of consecutive rows with the same prompt."""
    n = len(prompts)
    if group_size and n % group_size == 0:
        bounds = [(i, i + group_size) for i in range(0, n, group_size)]
        if all(len({repr(p) for p in prompts[a:b]}) == 1 for a, b in bounds):
            return bounds
    bounds, start = [], 0
    for i in range(1, n + 1):
        if i == n or repr(prompts[i]) != repr(prompts[start]):
            bounds.append((start, i))
            start = i
    return bounds


class _Prompts:
    """Distinct prompts, stored once and referred to by index."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.index: dict[str, int] = {}

    def add(self, prompt: Any) -> int:
        key = json.dumps(prompt, sort_keys=True, default=str)
        if key not in self.index:
            self.index[key] = len(self.items)
            self.items.append(prompt)
        return self.index[key]


def _extra(table: dict[str, list], names: list[str], row: int) -> dict[str, str]:
    out = {}
    for name in names:
        value = table[name][row]
        if value is not None:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            out[name] = text[:EXTRA_CHARS]
    return out


def step_groups(
    table: dict[str, list], reward_names: list[str], group_size: int | None, prompts: _Prompts
) -> list[dict[str, Any]]:
    """One completions table as groups: `{"p": prompt index, "rows": [[completion, reward,
    advantage, [reward per function], {extra}], ...]}` in the logged order."""
    logged_prompts = [_decoded(p) for p in table["prompt"]]
    per_func = [table.get(f"rewards/{name}") for name in reward_names]
    extra_names = [k for k in table if k not in KNOWN_COLUMNS and not k.startswith("rewards/")]
    groups = []
    for start, stop in _group_bounds(logged_prompts, group_size):
        rows = []
        for i in range(start, stop):
            funcs = [_number(col[i]) if col is not None else None for col in per_func]
            row = [
                _decoded(table["completion"][i]),
                _number(table["reward"][i]),
                _number(table["advantage"][i]),
                funcs,
            ]
            extra = _extra(table, extra_names, i)
            rows.append(row + [extra] if extra else row)
        groups.append({"p": prompts.add(logged_prompts[start]), "rows": rows})
    return groups


def _reward_names(info: dict[str, Any], tables: list[dict[str, list]]) -> list[str]:
    names = [r["name"] for r in info.get("reward_funcs") or [] if "name" in r]
    if names:
        return names
    columns = tables[0].keys() if tables else []
    return [c.removeprefix("rewards/") for c in columns if c.startswith("rewards/")]


def read_tables(run: Path) -> tuple[list[tuple[int, dict[str, list]]], int]:
    """`[(step, columns)]` of every readable completions table, and how many were not."""
    import pyarrow.parquet as pq

    folder = run / rundir.COMPLETIONS_DIR
    tables, unreadable = [], 0
    for path in sorted(folder.glob("step_*.parquet")) if folder.is_dir() else []:
        try:
            step = int(path.stem.split("_")[1])
            tables.append((step, pq.read_table(path).to_pydict()))
        except Exception:  # a damaged table is counted and shown, not fatal
            unreadable += 1
    return tables, unreadable


def _weights(run: Path) -> str | None:
    from .weights import model_kind

    try:
        return model_kind(run)
    except ValueError:
        return None


def report_data(run: Path) -> dict[str, Any]:
    """Everything the page shows, as one JSON-able dict."""
    info = rundir.read_json(run / rundir.RUN_INFO_FILE) or {}
    tables, unreadable = read_tables(run)
    names = _reward_names(info, [t for _, t in tables])
    group_size = (info.get("objective") or {}).get("num_generations")
    prompts = _Prompts()
    # a table is named by the step its rollout was sampled at (`global_step`, 0-based); the
    # rollout trains the next optimizer step, whose `reward` in metrics.jsonl it is
    steps = [
        {"step": step + 1, "groups": step_groups(table, names, group_size, prompts)}
        for step, table in tables
    ]
    weights = {r["name"]: r.get("weight", 1.0) for r in info.get("reward_funcs") or []}
    return {
        "run": {
            "name": run.resolve().name,
            "path": str(run.resolve()),
            "written": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
            "training": lock_holder(run),
            "weights": _weights(run),
            "info": info,
        },
        "metrics": metric_columns(rundir.read_metrics(run)),
        "evaluation": rundir.read_json(run / rundir.EVAL_FILE),
        "rewardNames": names,
        "rewardWeights": [weights.get(n, 1.0) for n in names],
        "prompts": prompts.items,
        "steps": steps,
        "unreadableTables": unreadable,
    }


def render(data: dict[str, Any]) -> str:
    """The page: the template with the data inlined (`<` escaped, so no text ends the script)."""
    page = resources.files(__package__).joinpath(TEMPLATE).read_text(encoding="utf-8")
    blob = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)
    blob = blob.replace("<", "\\u003c")
    title = f"{data['run']['name']}: GRPO run report".replace("<", "&lt;")
    return page.replace(TITLE_MARK, title).replace(DATA_MARK, blob)


def check_run(run_dir: str | Path) -> Path:
    """The run dir, or a one-line `ReportError` when it holds no run to report."""
    run = Path(run_dir).expanduser()
    if not run.is_dir():
        what = "is not a directory" if run.exists() else "does not exist"
        raise ReportError(f"run dir {run_dir} {what}; pass the output_dir of a training run")
    markers = (rundir.METRICS_FILE, rundir.COMPLETIONS_DIR, rundir.EVAL_FILE)
    if not any((run / name).exists() for name in markers):
        raise ReportError(
            f"{run_dir} holds no run: no {rundir.METRICS_FILE}, {rundir.COMPLETIONS_DIR}/ or "
            f"{rundir.EVAL_FILE}; pass the output_dir of a training run (a checkpoint-N dir's "
            "run is its parent)"
        )
    return run


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the run's report (default `RUN_DIR/report.html`, atomically); returns its path.
    A run still training is reported as far as it got, with a warning (and a banner)."""
    run = check_run(run_dir)
    data = report_data(run)
    holder = data["run"]["training"]
    if holder is not None:
        steps = data["metrics"]["train"]["step"]
        logger.warning(
            "%s is still training (%s): the report shows it up to step %s; the run writes a "
            "final one when it ends.",
            run_dir,
            holder,
            steps[-1] if steps else 0,
        )
    path = Path(out).expanduser() if out is not None else run / rundir.REPORT_FILE
    return rundir.write_text_atomic(path, render(data))
