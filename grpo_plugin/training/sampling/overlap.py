"""Overlapped scoring (`overlap_scoring=True`): the reward functions score each group as soon as
its G completions have finished, while the other groups still decode (the idea of trl#4489).

The decode loop runs in a worker thread; the reward functions stay in the main thread, where
their time limit works (`watchdog.py` signals the main thread) and where math-verify's
`signal.alarm` needs them. After each decode step the worker queues every group whose rows have
all reached EOS (`GroupWatch`); the main thread decodes that group's text and calls the rewards
on its G rows. Groups cut off at `max_completion_length` end only with the loop and are scored
together after it. A reward that scores each completion on its own gives the same numbers as in
one call over the rollout; what changes is that a call sees one group (G rows), not the rollout.

It is meant for a GPU, where the decode thread mostly launches kernels, and for rewards that wait
(a sandbox run, an HTTP judge, `async` rewards). On a CPU it costs more than it hides: once a
second thread runs torch's parallel kernels, the two threads' OpenMP pools compete for the cores
(the decode measured slower in its thread than the scoring it hid; `benchmarks/overlap_scoring.py`,
docs/benchmarks.md), so it warns there.
Python-heavy rewards also share the interpreter lock with the decode loop. Single-turn rollouts
of our sampler only (not tools, environments or `rollout_func`: `check_inputs`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from ..._logging import warn_once
from ...rollout.prompts import decode_completions
from ...rollout.types import Rollout
from ...scoring.context import warn_if_unscored
from ...scoring.scorer import combine_rewards

logger = logging.getLogger(__name__)


class DecodeCancelled(Exception):
    """Raised in the decode thread when the main thread stopped (a reward failed, Ctrl-C)."""


def check_inputs(args: Any, tool_inputs: Any) -> None:
    """Refuse, before anything loads, what overlapped scoring cannot run on."""
    if not getattr(args, "overlap_scoring", False):
        return
    for given, name in (
        (tool_inputs.rollout_func, "rollout_func"),
        (tool_inputs.environments, "environment_factory"),
        (tool_inputs.tools or None, "tools"),
    ):
        if given is not None:
            raise ValueError(
                f"overlap_scoring scores single-turn groups as they finish decoding, and this run "
                f"has {name}; set overlap_scoring=False."
            )


class GroupWatch:
    """The decode loop's `on_step` (in the decode thread): queues `(p, ids (G, T), mask (G, T))`
    for each group p whose G rows have all finished, once."""

    def __init__(self, group: int, rows: int) -> None:
        self.group, self.queue = group, queue.Queue()
        self.reported = torch.zeros(rows // group, dtype=torch.bool)  # (P,)
        self.cancelled = threading.Event()

    def __call__(self, finished: torch.Tensor, tokens: list, live: list) -> None:
        if self.cancelled.is_set():
            raise DecodeCancelled
        done = finished.view(-1, self.group).all(dim=1).cpu()  # (P,)
        for p in (done & ~self.reported).nonzero().flatten().tolist():
            rows = slice(p * self.group, (p + 1) * self.group)
            ids = torch.stack([t[rows] for t in tokens], dim=1).cpu()  # (G, T)
            mask = torch.stack([m[rows] for m in live], dim=1).long().cpu()  # (G, T)
            self.queue.put((p, ids, mask))
        self.reported |= done


def _score_group(rewards: Any, tokenizer: Any, row: dict, ids, mask, group: int) -> torch.Tensor:
    """(G, F) rewards of one finished group, from its tokens (the same text the rollout gets)."""
    prompts = [row["prompt"]] * group
    batch = SimpleNamespace(completion_ids=ids, completion_mask=mask)
    completions, completion_ids = decode_completions(tokenizer, prompts, batch)
    columns = {k: [v] * group for k, v in row.items() if k != "prompt"}
    return rewards.scorer.score_columns(prompts, completions, completion_ids, columns)


def _group_rows(groups: list[int], group_size: int) -> list[int]:
    """The rollout rows of `groups` (group p holds rows p*G .. p*G + G-1), in order."""
    return [p * group_size + i for p in groups for i in range(group_size)]


def _score_rest(rollout: Rollout, rewards: Any, idx: list[int]) -> torch.Tensor:
    """(len(idx), F) rewards of rows `idx` (the groups that finished with the loop), one call."""
    pick = lambda values: [values[i] for i in idx]  # noqa: E731
    columns = {k: pick(v) for k, v in rollout.columns.items()}
    scorer = rewards.scorer
    return scorer.score_columns(
        pick(rollout.prompts), pick(rollout.completions), pick(rollout.completion_ids), columns
    )


def sample_and_score(
    sample: Callable[[GroupWatch], Rollout],
    rewards: Any,
    tokenizer: Any,
    rows: list[dict],
    group: int,
) -> tuple[Rollout, dict[str, float]]:
    """Run `sample(on_step)` in a worker thread and score finished groups meanwhile; returns the
    scored rollout and its seconds: `generate_s` (the decode), `reward_s` (scoring after the
    decode ended) and `reward_hidden_s` (scoring while it ran)."""
    watch, out = GroupWatch(group, len(rows) * group), {}
    if not torch.cuda.is_available():
        warn_once(
            "overlap-scoring-cpu",
            "overlap_scoring on a CPU: the decode thread's OpenMP pool competes with the main "
            "thread's for the cores (decoding measured slower: docs/benchmarks.md); it pays on a GPU. "
            "Set overlap_scoring=False here unless the rewards wait much longer than they decode.",
            logger,
        )

    def decode() -> None:
        try:
            out["rollout"] = sample(watch)
        except BaseException as err:  # re-raised in the main thread
            out["error"] = err
        finally:
            out["end"] = time.perf_counter()
            watch.queue.put(None)

    start = time.perf_counter()
    worker = threading.Thread(target=decode, name="grpo-decode", daemon=True)
    worker.start()
    scored, spans = {}, []
    try:
        while (item := watch.queue.get()) is not None:
            p, ids, mask = item
            t = time.perf_counter()
            scored[p] = _score_group(rewards, tokenizer, rows[p], ids, mask, group)
            spans.append((t, time.perf_counter()))
    except BaseException:
        watch.cancelled.set()  # the decode stops at its next step
        worker.join()
        raise
    worker.join()
    if "error" in out:
        raise out["error"]
    rollout, decoded = out["rollout"], out["end"]
    hidden = sum(max(0.0, min(e, decoded) - s) for s, e in spans)  # scoring while it decoded
    rest = [p for p in range(len(rows)) if p not in scored]
    per_func = torch.empty(len(rows) * group, len(rewards.funcs))  # (N, F)
    for p, values in scored.items():
        per_func[p * group : (p + 1) * group] = values
    if rest:
        idx = _group_rows(rest, group)
        per_func[torch.tensor(idx)] = _score_rest(rollout, rewards, idx)
    rollout.per_func, rollout.rewards = per_func, combine_rewards(per_func, rewards.weights)
    warn_if_unscored(rollout)
    end = time.perf_counter()
    return rollout, {
        "generate_s": decoded - start,
        "reward_s": end - decoded,
        "reward_hidden_s": hidden,
    }
