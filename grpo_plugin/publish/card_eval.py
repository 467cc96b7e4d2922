"""The model card's evaluation section.

Reads `eval.json` (the recipe pipeline's before/after evaluations, the curve, the best step and
the alarms) and, for runs trained through the Python API (no `eval.json`), the `evaluation` part of
`grpo_run.json` and the `eval_*` lines of `metrics.jsonl`. Every accuracy is shown with its n and
its 95% Wilson score interval (`evaluation/curve.py`).
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

from ..evaluation.curve import build_curve, wilson_interval
from ..run.rundir import EVAL_FILE, read_json, read_metrics

_MARKDOWN_PUNCTUATION = re.compile(r"([\\`*_\[\]!|~])")  # what can start markup mid-line


def md_text(value: Any) -> str:
    """A name from the run (its folder, a model path) as literal Markdown text: HTML escaped (the
    Hub renders the card's HTML), Markdown punctuation escaped, one line."""
    one_line = " ".join(str(value).split())
    return _MARKDOWN_PUNCTUATION.sub(r"\\\1", html.escape(one_line, quote=False))


def md_code(value: Any) -> str:
    """A name from the run as an inline code span that nothing in it can end (a backtick
    becomes a quote; inside code, HTML is shown, not rendered)."""
    return "`" + " ".join(str(value).split()).replace("`", "'") + "`"


def _pct(value: Any) -> str:
    return f"{100 * value:.1f}%" if isinstance(value, (int, float)) else "–"


def _interval(ci: list[float] | None) -> str:
    return f"{100 * ci[0]:.1f}–{100 * ci[1]:.1f}%" if ci else "–"


def _accuracy_cell(result: dict[str, Any]) -> str:
    accuracy, n = result.get("accuracy"), result.get("n")
    if not isinstance(accuracy, (int, float)):
        return "–"
    if not n:
        return _pct(accuracy)
    return f"{_pct(accuracy)} ({_interval(wilson_interval(round(accuracy * n), n))})"


def _change(before: Any, after: Any) -> str:
    if isinstance(before, (int, float)) and isinstance(after, (int, float)):
        return f"{100 * (after - before):+.1f} pts"
    return "–"


def _before_after(evaluation: dict[str, Any]) -> list[str]:
    before, after = evaluation.get("before") or {}, evaluation.get("after") or {}
    if not before and not after:
        return []
    n = after.get("n", before.get("n"))
    lines = [
        f"Held-out prompts: {n if n is not None else '–'} from {md_code(evaluation.get('dataset', '?'))}, "
        f"scored by {md_code(evaluation.get('reward', '?'))} (greedy decoding for accuracy; in parentheses "
        "the 95% Wilson score interval).",
        *_validation_note(evaluation),
        "",
        "| metric | before | after | change |",
        "|---|---|---|---|",
        f"| accuracy (n = {n}) | {_accuracy_cell(before)} | {_accuracy_cell(after)} | "
        f"{_change(before.get('accuracy'), after.get('accuracy'))} |",
    ]
    for key in [k for k in {**before, **after} if k.startswith("pass@")]:
        b, a = before.get(key), after.get(key)
        label = "pass@1 (sampled)" if key == "pass@1" else key
        lines.append(f"| {label} | {_pct(b)} | {_pct(a)} | {_change(b, a)} |")
    return lines + [""]


def _validation_note(evaluation: dict[str, Any]) -> list[str]:
    n = (evaluation.get("splits") or {}).get("validation")
    if not n:
        return []
    return [
        f"The evaluations during training (the curve and the best step) ran on a separate "
        f"validation split of {n} prompts; these test prompts chose nothing."
    ]


def _curve_table(curve: list[dict[str, Any]], split: str) -> list[str]:
    if len(curve) < 2:
        return []
    lines = [
        f"Greedy {split} accuracy at every evaluation (step 0 is before training):",
        "",
        "| step | accuracy | 95% interval | n |",
        "|---|---|---|---|",
    ]
    for p in curve:
        n = p.get("n") if p.get("n") is not None else "–"
        lines.append(f"| {p['step']} | {_pct(p['accuracy'])} | {_interval(p.get('ci95'))} | {n} |")
    return lines + [""]


def _metric_value(name: str, value: float) -> str:
    return _pct(value) if ("accuracy" in name or "pass@" in name) else f"{value:.4g}"


def _best_line(evaluation: dict[str, Any], watch: dict[str, Any], run: dict[str, Any]) -> list[str]:
    best_metric = evaluation.get("best_metric") or {}
    step = evaluation.get("best_step", watch.get("best_step"))
    name = best_metric.get("name", watch.get("metric"))
    value = best_metric.get("value", watch.get("best_metric"))
    if step is None or name is None or value is None:
        return []
    weights = watch.get("weights_step", run.get("global_step"))
    if weights == step:
        where = "these weights are from that step"
    else:
        where = f"these weights are from step {weights}, the last one"
    return [f"**Best step: {step}** ({name} = {_metric_value(name, value)}); {where}.", ""]


def _alarm_lines(alarms: list[dict[str, Any]]) -> list[str]:
    if not alarms:
        return []
    more = f" ({len(alarms) - 1} later evaluations diverged too.)" if len(alarms) > 1 else ""
    return [f"> **Warning.** {alarms[0].get('message', '')}{more}", ""]


def eval_section(output_dir: Path, run: dict[str, Any]) -> str:
    """The `## Evaluation` section, or "" when the run has no held-out evaluation at all."""
    evaluation = read_json(output_dir / EVAL_FILE) or {}
    watch = run.get("evaluation") or {}
    curve = evaluation.get("curve") or build_curve(
        read_metrics(output_dir),
        evaluation.get("before"),
        evaluation.get("after"),
        watch.get("weights_step", run.get("global_step")),
    )
    split = "validation" if evaluation.get("curve_split") == "validation" else "held-out"
    lines = (
        _before_after(evaluation)
        + _curve_table(curve, split)
        + _best_line(evaluation, watch, run)
        + _alarm_lines(evaluation.get("alarms") or watch.get("alarms") or [])
    )
    if not lines:
        return ""
    return "\n".join(["## Evaluation", "", *lines]).rstrip() + "\n"
