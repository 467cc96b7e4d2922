"""DAPO dynamic sampling: drop groups whose rewards all agree, refill with fresh prompts.

A group whose G rewards are identical has zero advantage everywhere, so it only dilutes the batch
(DAPO, https://arxiv.org/abs/2503.14476, section 3.2). We drop such groups and sample fresh prompts
for up to `max_rounds` rounds; if the batch is still short we pad it back with dropped groups
(advantage 0), so the batch size, and with it the step's cost and normalisation, never changes.
TRL has no dynamic sampling (trl#3708).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F


@dataclass
class ScoredRollout:
    """One rollout with its scores; N = len(rows) * G rows, grouped contiguously by prompt."""

    rows: list[dict[str, Any]]  # P dataset rows
    batch: Any  # rollout.RolloutBatch, tensors (N, ...)
    completions: list[Any]  # N decoded completions (str or chat messages)
    per_func: torch.Tensor  # (N, F) rewards per function, NaN = not scored
    rewards: torch.Tensor  # (N,) weighted sum


def informative_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(N,) rewards -> (P,) bool: the group has at least two different scored rewards."""
    grouped = rewards.view(-1, group_size)  # (P, G)
    scored = ~torch.isnan(grouped)
    hi = torch.where(scored, grouped, -torch.inf).amax(dim=1)
    lo = torch.where(scored, grouped, torch.inf).amin(dim=1)
    return (scored.sum(dim=1) >= 2) & (hi > lo)


def select_groups(s: ScoredRollout, groups: list[int], group_size: int) -> ScoredRollout:
    rows = torch.tensor(
        [g * group_size + j for g in groups for j in range(group_size)], dtype=torch.long
    )
    fields = {
        name: getattr(s.batch, name)[rows]
        for name in (
            "prompt_ids",
            "prompt_mask",
            "completion_ids",
            "completion_mask",
            "is_truncated",
        )
    }
    batch = replace(s.batch, **fields)
    return ScoredRollout(
        rows=[s.rows[g] for g in groups],
        batch=batch,
        completions=[s.completions[i] for i in rows.tolist()],
        per_func=s.per_func[rows],
        rewards=s.rewards[rows],
    )


def _pad_to(x: torch.Tensor, width: int, value: int, left: bool) -> torch.Tensor:
    extra = width - x.shape[1]
    return F.pad(x, (extra, 0) if left else (0, extra), value=value) if extra > 0 else x


def concat_rollouts(a: ScoredRollout, b: ScoredRollout, pad_token_id: int) -> ScoredRollout:
    """Stack two rollouts, left-padding prompts and right-padding completions to a common width."""
    lp = max(a.batch.prompt_ids.shape[1], b.batch.prompt_ids.shape[1])
    tc = max(a.batch.completion_ids.shape[1], b.batch.completion_ids.shape[1])

    def cat(name: str, width: int, value: int, left: bool) -> torch.Tensor:
        xa, xb = getattr(a.batch, name), getattr(b.batch, name)
        return torch.cat([_pad_to(xa, width, value, left), _pad_to(xb, width, value, left)])

    batch = replace(
        a.batch,
        prompt_ids=cat("prompt_ids", lp, pad_token_id, True),
        prompt_mask=cat("prompt_mask", lp, 0, True),
        completion_ids=cat("completion_ids", tc, pad_token_id, False),
        completion_mask=cat("completion_mask", tc, 0, False),
        is_truncated=torch.cat([a.batch.is_truncated, b.batch.is_truncated]),
        num_prefill_tokens=a.batch.num_prefill_tokens + b.batch.num_prefill_tokens,
        num_generated_tokens=a.batch.num_generated_tokens + b.batch.num_generated_tokens,
    )
    return ScoredRollout(
        rows=a.rows + b.rows,
        batch=batch,
        completions=a.completions + b.completions,
        per_func=torch.cat([a.per_func, b.per_func]),
        rewards=torch.cat([a.rewards, b.rewards]),
    )


def refill(
    first: ScoredRollout,
    group_size: int,
    sample_fresh: Callable[[int], ScoredRollout],
    max_rounds: int,
    pad_token_id: int,
) -> tuple[ScoredRollout, int]:
    """Keep informative groups, refill from `sample_fresh(k)`; return (rollout, groups filtered)."""
    target = len(first.rows)
    mask = informative_groups(first.rewards, group_size)
    kept = select_groups(first, mask.nonzero().flatten().tolist(), group_size)
    spare = select_groups(first, (~mask).nonzero().flatten().tolist(), group_size)
    filtered = int((~mask).sum())
    for _ in range(max_rounds):
        missing = target - len(kept.rows)
        if missing == 0:
            break
        fresh = sample_fresh(missing)
        fmask = informative_groups(fresh.rewards, group_size)
        filtered += int((~fmask).sum())
        good = select_groups(fresh, fmask.nonzero().flatten().tolist(), group_size)
        kept = concat_rollouts(kept, good, pad_token_id)
    missing = target - len(kept.rows)
    if missing > 0:  # still short: pad with zero-advantage groups to keep the batch size
        kept = concat_rollouts(
            kept, select_groups(spare, list(range(missing)), group_size), pad_token_id
        )
    return kept, filtered
