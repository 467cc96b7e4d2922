"""DAPO dynamic sampling: drop groups whose rewards all agree, refill with fresh prompts.

A group whose G rewards are identical has zero advantage everywhere, so it only dilutes the batch
(DAPO, https://arxiv.org/abs/2503.14476, section 3.2). We drop such groups and sample fresh prompts
for up to `max_rounds` rounds; if the batch is still short we pad it back with dropped groups
(advantage 0), so the batch size, and with it the step's cost and normalisation, never changes.
TRL has no dynamic sampling (trl#3708).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from ..core.tensors import pad_columns
from .types import Rollout, RolloutBatch


def informative_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(N,) rewards -> (P,) bool: the group has at least two different scored rewards."""
    grouped = rewards.view(-1, group_size)  # (P, G)
    scored = ~torch.isnan(grouped)
    hi = torch.where(scored, grouped, -torch.inf).amax(dim=1)
    lo = torch.where(scored, grouped, torch.inf).amin(dim=1)
    return (scored.sum(dim=1) >= 2) & (hi > lo)


def select_groups(r: Rollout, groups: list[int], group_size: int) -> Rollout:
    """The rollout restricted to the given groups (prompt indices), in that order."""
    rows = [g * group_size + j for g in groups for j in range(group_size)]
    index = torch.tensor(rows, dtype=torch.long)
    return Rollout(
        rows=[r.rows[g] for g in groups],
        batch=r.batch.select(index),
        prompts=[r.prompts[i] for i in rows],
        completions=[r.completions[i] for i in rows],
        completion_ids=[r.completion_ids[i] for i in rows],
        columns={k: [v[i] for i in rows] for k, v in r.columns.items()},
        per_func=r.per_func[index],
        rewards=r.rewards[index],
    )


def concat_rollouts(a: Rollout, b: Rollout, pad_token_id: int) -> Rollout:
    """Stack two scored rollouts, left-padding prompts and right-padding completions."""
    lp = max(a.batch.prompt_ids.shape[1], b.batch.prompt_ids.shape[1])
    tc = max(a.batch.completion_ids.shape[1], b.batch.completion_ids.shape[1])

    def cat(name: str, width: int, value: int, left: bool) -> torch.Tensor:
        xa, xb = getattr(a.batch, name), getattr(b.batch, name)
        return torch.cat([pad_columns(xa, width, value, left), pad_columns(xb, width, value, left)])

    batch = replace(
        a.batch,
        prompt_ids=cat("prompt_ids", lp, pad_token_id, True),
        prompt_mask=cat("prompt_mask", lp, 0, True),
        completion_ids=cat("completion_ids", tc, pad_token_id, False),
        completion_mask=cat("completion_mask", tc, 0, False),
        is_truncated=torch.cat([a.batch.is_truncated, b.batch.is_truncated]),
        num_prefill_tokens=a.batch.num_prefill_tokens + b.batch.num_prefill_tokens,
        num_generated_tokens=a.batch.num_generated_tokens + b.batch.num_generated_tokens,
        num_reused_tokens=a.batch.num_reused_tokens + b.batch.num_reused_tokens,
        **_tool_rows(a.batch, b.batch, tc),
    )
    return Rollout(
        rows=a.rows + b.rows,
        batch=batch,
        prompts=a.prompts + b.prompts,
        completions=a.completions + b.completions,
        completion_ids=a.completion_ids + b.completion_ids,
        columns={k: a.columns[k] + b.columns[k] for k in a.columns},
        per_func=torch.cat([a.per_func, b.per_func]),
        rewards=torch.cat([a.rewards, b.rewards]),
    )


def _tool_rows(a: RolloutBatch, b: RolloutBatch, width: int) -> dict[str, torch.Tensor]:
    """The optional row tensors of two batches stacked, when either has them (tools, sampling
    log-probs)."""
    out = {}
    for name in RolloutBatch.OPTIONAL_ROW_FIELDS:
        if getattr(a, name) is None and getattr(b, name) is None:
            continue
        parts = [x.tool_field(name) for x in (a, b)]
        if name in ("sampled_mask", "sampling_logps"):  # (n, Tc) each
            parts = [pad_columns(p, width, 0, left=False) for p in parts]
        out[name] = torch.cat(parts)
    return out


def refill(
    first: Rollout,
    group_size: int,
    sample_fresh: Callable[[int], Rollout],
    max_rounds: int,
    pad_token_id: int,
) -> tuple[Rollout, int]:
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
