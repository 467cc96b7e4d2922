"""Rollouts through a `generate` that user code put in place of transformers' own.

Our decode loop (`generation.py`) never calls `model.generate`. So when user code replaces it, on
the model object (`patch.object(model, "generate", fake)`, `model.generate = my_sampler`) or on
transformers' `GenerationMixin` itself, ignoring the replacement would train on completions the
user did not ask for: silently wrong. TRL samples through `model.generate`, and test code and
scripts written for it rely on that (scripted completions, tool calls forced in tests). In that
case, and only then, the rollout goes through the replaced `generate` here: one call per turn
(prompt or whole history re-encoded, no KV cache shared across turns or within a group), with
TRL's arguments (`max_new_tokens`, `do_sample`, the sampling parameters, pad and eos ids). Each
completion is cut after its first eos; the rollout's sampling noise (`noise.py`) is not used.

A subclass that overrides `generate` (PEFT's wrapper, a model's own) is not a replacement: it
only forwards to transformers' loop, which ours stands in for.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from .._compat import unwrap_peft
from ..core.tensors import left_pad, right_pad
from .types import GenerationRequest, RolloutBatch

Generate = Callable[..., Any]


def replaced_generate(model: torch.nn.Module) -> Generate | None:
    """The `generate` user code put in place of transformers' own on `model` (or on
    `GenerationMixin`), else None."""
    from transformers.generation.utils import GenerationMixin

    for module in (model, unwrap_peft(model)):
        if "generate" in vars(module):  # set on the instance
            return module.generate
    if not inspect.isfunction(inspect.getattr_static(GenerationMixin, "generate")):
        return model.generate  # transformers' own replaced (e.g. a class-level mock)
    return None


def _call(generate: Generate, histories: list[list[int]], request: GenerationRequest, budget: int):
    """One `generate` call on left-padded `histories`: `(tokens, finished)` per row, each row's
    new tokens cut after its first eos (`finished`), at most `budget` of them."""
    pad = request.pad_id
    ids, mask = left_pad(histories, pad)  # (n, L)
    s = request.sampling
    out = generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=budget,
        do_sample=s.temperature > 0,
        temperature=s.temperature if s.temperature > 0 else None,
        top_p=s.top_p,
        top_k=s.top_k,
        min_p=s.min_p,
        repetition_penalty=s.repetition_penalty,
        pad_token_id=pad,
        eos_token_id=list(request.eos_token_ids),
    )
    sequences = getattr(out, "sequences", out)  # (n, L + T)
    if not (
        isinstance(sequences, torch.Tensor)
        and sequences.dim() == 2
        and sequences.shape[0] == ids.shape[0]
        and torch.equal(sequences[:, : ids.shape[1]].cpu(), ids)
    ):
        got = tuple(sequences.shape) if isinstance(sequences, torch.Tensor) else type(sequences)
        raise ValueError(
            f"the replaced model.generate returned {got} for input_ids {tuple(ids.shape)}; like "
            "transformers' generate it must return each row's input ids followed by its new tokens"
        )
    rows = []
    for row in sequences[:, ids.shape[1] :].tolist():
        row = row[:budget]
        ends = [i for i, t in enumerate(row) if t in request.eos_token_ids]
        rows.append((row[: ends[0] + 1], True) if ends else (row, False))
    return rows


@torch.no_grad()
def generate_groups_with(
    generate: Generate, prompt_ids: list[list[int]], request: GenerationRequest
) -> RolloutBatch:
    """`generation.generate_groups` through `generate`: G rows per prompt, one call."""
    group = request.num_generations
    repeated = [p for p in prompt_ids for _ in range(group)]
    turns = _call(generate, repeated, request, request.sampling.max_new_tokens)
    p_ids, p_mask = left_pad(repeated, request.pad_id)  # (N, Lp)
    c_ids, c_mask = right_pad([t for t, _ in turns], request.pad_id)  # (N, Tc)
    return RolloutBatch(
        prompt_ids=p_ids,
        prompt_mask=p_mask,
        completion_ids=c_ids,
        completion_mask=c_mask,
        is_truncated=torch.tensor([not done for _, done in turns]),
        num_prefill_tokens=int(p_mask.sum()),
        num_generated_tokens=int(c_mask.sum()),
    )


@torch.no_grad()
def tool_loop_with(generate: Generate, loop: Any, request: GenerationRequest, limit: int | None):
    """`multiturn.run_tool_loop` through `generate` on `loop` (a `multiturn._Loop`: its
    trajectories, parser and tool runner): each turn re-encodes every going row's history."""
    rows, rounds, max_len = list(range(len(loop.prompts))), 0, loop.max_len
    while rows:
        histories = [loop.prompts[r] + loop.traj[r].ids for r in rows]
        budget = max_len - min(len(loop.traj[r].ids) for r in rows)
        turn = replace(request, sampling=replace(request.sampling, max_new_tokens=budget))
        going = []
        for r, (tokens, finished) in zip(rows, _call(generate, histories, turn, budget)):
            left = max_len - len(loop.traj[r].ids)
            calls = loop.record_turn(r, tokens[:left], finished and len(tokens) <= left)
            if calls:
                going.append((r, r, [], calls))
        if not going or (limit is not None and rounds >= limit):
            break
        blocks = loop.run_tools(going)
        rounds += 1
        rows = [r for _, r, _ in blocks]
