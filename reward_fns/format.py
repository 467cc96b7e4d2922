"""Shape rewards: ``think_format`` and ``soft_overlong``.

``think_format`` (DeepSeek-R1's format reward, https://arxiv.org/abs/2501.12948): 1.0 when the
completion is exactly ``<think>…</think>`` then ``<answer>…</answer>``, whitespace allowed
around and between the blocks, neither block empty, and no tag repeated or nested.
Tag names are parameters. Departure from open-r1's ``format_reward``: its regex
``^<think>.*?</think>\\s*<answer>.*?</answer>$`` accepts
``<think>a</think><answer>b</answer><answer>c</answer>``; this one does not.

``soft_overlong`` is DAPO's soft overlong punishment (https://arxiv.org/abs/2503.14476, eq. 13),
from the completion length ``|y|`` in tokens (``completion_ids``), with
``L_max = max_completion_length`` and ``L_cache = cache_length``::

    R(y) = 0                                   if |y| <= L_max - L_cache
         = ((L_max - L_cache) - |y|) / L_cache if L_max - L_cache < |y| <= L_max
         = -1                                  if |y| > L_max
"""

from __future__ import annotations

import re
from typing import Any

from reward_fns.registry import completion_text, in_process, register


def _format_pattern(think_tag: str, answer_tag: str) -> re.Pattern[str]:
    for tag in (think_tag, answer_tag):
        if not re.fullmatch(r"[A-Za-z_][\w.-]*", tag):
            raise ValueError(f"tag names must look like 'think', got {tag!r} (no angle brackets)")
    if think_tag == answer_tag:
        raise ValueError("think_tag and answer_tag must differ")
    t, a = re.escape(think_tag), re.escape(answer_tag)
    return re.compile(rf"\s*<{t}>(?P<think>.*?)</{t}>\s*<{a}>(?P<answer>.*?)</{a}>\s*", re.DOTALL)


@register("think_format")
@in_process
def think_format(
    prompts: Any = None,
    completions: Any = None,
    completion_ids: Any = None,
    *,
    think_tag: str = "think",
    answer_tag: str = "answer",
    **columns: Any,
) -> list[float | None]:
    """1.0 when the completion is exactly <think>…</think> then <answer>…</answer>."""
    pattern = _format_pattern(think_tag, answer_tag)
    tags = [f"<{t}>" for t in (think_tag, answer_tag)] + [
        f"</{t}>" for t in (think_tag, answer_tag)
    ]
    scores: list[float | None] = []
    for completion in completions:
        text = completion_text(completion)
        # Each tag exactly once (what the checks below demand of a match) before the regex runs:
        # its lazy groups take quadratic time on a text of many closing tags.
        if any(text.count(tag) != 1 for tag in tags):
            scores.append(0.0)
            continue
        match = pattern.fullmatch(text)
        ok = (
            match is not None
            and all(match.group(g).strip() for g in ("think", "answer"))
            and not any(tag in match.group(g) for g in ("think", "answer") for tag in tags)
        )
        scores.append(float(ok))
    return scores


def soft_overlong_penalty(length: int, max_completion_length: int, cache_length: int) -> float:
    """DAPO eq. 13 for one completion of ``length`` tokens."""
    expected_max = max_completion_length - cache_length
    if length <= expected_max:
        return 0.0
    if length <= max_completion_length:
        return (expected_max - length) / cache_length
    return -1.0


@register("soft_overlong")
@in_process
def soft_overlong(
    prompts: Any = None,
    completions: Any = None,
    completion_ids: Any = None,
    *,
    max_completion_length: int | None = None,
    cache_length: int | None = None,
    **columns: Any,
) -> list[float | None]:
    """DAPO soft overlong punishment (eq. 13) from completion lengths in tokens."""
    if max_completion_length is None or cache_length is None:
        raise TypeError(
            "soft_overlong needs both parameters: use reward_fns.get('soft_overlong', "
            "max_completion_length=..., cache_length=...)"
        )
    if not 0 < cache_length <= max_completion_length:
        raise ValueError(
            f"need 0 < cache_length <= max_completion_length, got cache_length={cache_length}, "
            f"max_completion_length={max_completion_length}"
        )
    if completion_ids is None:
        raise ValueError("soft_overlong needs completion_ids (token ids) to measure lengths")
    return [
        soft_overlong_penalty(len(ids), max_completion_length, cache_length)
        for ids in completion_ids
    ]
