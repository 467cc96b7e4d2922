"""The completions table of each rollout: `completions/step_XXXXX.parquet`, and a few printed.

Every process's completions are gathered with their advantages and the `log_extra` columns the
reward functions added (`scoring/context.py`), and process 0 alone writes them (the one-writer rule
of `distributed.py`), so the table holds the global rollout whatever the number of processes.
With `num_completions_to_print`, the first few rows are also logged as a plain-text table.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from .. import distributed
from .._logging import visible
from ..rollout.types import Rollout
from ..scoring.context import aligned_extra_columns, gather_extra_columns
from . import rundir

logger = logging.getLogger(__name__)


def write_completions(
    trainer: Any, rollout: Rollout, advantages: torch.Tensor, extra: dict[str, list[Any]]
) -> None:
    """Gather (a collective: every process calls it) and write the rollout's completions table.

    `advantages` `(N,)` are this process's; `extra` the `log_extra` columns logged while scoring
    it (a column without one value per completion is left out, with a warning).
    """
    a, accelerator = trainer.args, trainer.accelerator
    pad_id = trainer.processing_class.pad_token_id
    extra = aligned_extra_columns(extra, len(rollout.completions))
    extra = gather_extra_columns(accelerator, extra, len(rollout.completions))
    rollout, advantages = distributed.gather_rollout(accelerator, rollout, pad_id, advantages)
    if not trainer.is_world_process_zero():
        return
    step = trainer.state.global_step
    records = completion_records(rollout, advantages.cpu(), trainer.reward_names, step)
    records.update(extra)
    rundir.write_completions_parquet(rundir.completions_file(a.output_dir, step), records)
    if a.num_completions_to_print:
        table = format_completions(records, a.num_completions_to_print, a.log_unique_prompts)
        logger.info("Completions at step %d:\n%s", step, table)


def completion_records(
    r: Rollout, advantages: torch.Tensor, names: Sequence[str], step: int
) -> dict[str, list]:
    """Columns of `completions/step_XXXXX.parquet`: one row per completion."""
    records: dict[str, list] = {
        "step": [step] * len(r.completions),
        "prompt": list(r.prompts),
        "completion": r.completions,
        "reward": r.rewards.tolist(),
        "advantage": advantages.tolist(),
    }
    for j, name in enumerate(names):
        records[f"rewards/{name}"] = r.per_func[:, j].tolist()
    return records


def format_completions(records: dict[str, list], limit: int, unique_prompts: bool = False) -> str:
    """A plain-text table of up to `limit` completions of one rollout (prompt, completion, reward,
    advantage); with `unique_prompts`, the first completion of each distinct prompt only."""
    rows, seen = [], set()
    for i, prompt in enumerate(records["prompt"]):
        key = repr(prompt)
        if unique_prompts and key in seen:
            continue
        seen.add(key)
        rows.append(i)
        if len(rows) == limit:
            break

    def short(value) -> str:
        text = value if isinstance(value, str) else repr(value)
        return visible(" ".join(text.split())[:80])  # the table is logged

    lines = ["reward | advantage | prompt | completion"]
    for i in rows:
        reward, adv = records["reward"][i], records["advantage"][i]
        lines.append(
            f"{reward:.3f} | {adv:+.3f} | {short(records['prompt'][i])} | "
            f"{short(records['completion'][i])}"
        )
    return "\n".join(lines)
