"""Next-token selection: repetition penalty, suppressed tokens, temperature, top-k, top-p, min-p,
then one uniform per row.

Randomness is one uniform per row per step, given by the caller (see `noise.py`), turned into a
token by inverse-CDF. Paths that decode the same rows in a different layout (prefix-shared or
not, rows dropped from the batch or not) therefore get identical draws and pick identical tokens,
which is what makes those optimisations testable as exact (HF's `torch.multinomial` draws differ).

Departure from HF: the repetition penalty only counts real prompt tokens (HF also counts the
left padding).
"""

from __future__ import annotations

import torch

from .types import SamplingParams


def apply_repetition_penalty(
    logits: torch.Tensor, seen: torch.Tensor, penalty: float
) -> torch.Tensor:
    """HF's CTRL-style penalty on `(B, V)` logits: seen tokens' logits are divided by `penalty`
    (multiplied when negative)."""
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, penalised, logits)


def filter_top_k_top_p(logits: torch.Tensor, top_k: int | None, top_p: float) -> torch.Tensor:
    """HF's TopK then TopP warpers on `(B, V)` logits (removed entries become -inf)."""
    if top_k:
        kth_best = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_best, float("-inf"))
    if top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, descending=False, dim=-1)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cumulative <= (1 - top_p)
        remove_sorted[..., -1] = False  # always keep the most likely token
        remove = remove_sorted.scatter(-1, sorted_idx, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits


def filter_min_p(logits: torch.Tensor, min_p: float | None) -> torch.Tensor:
    """HF's MinP warper on `(B, V)` logits: drop tokens whose probability is below `min_p` times the
    most likely token's (which is always kept)."""
    if not min_p:
        return logits
    probs = logits.softmax(dim=-1)  # (B, V)
    threshold = min_p * probs.max(dim=-1, keepdim=True).values  # (B, 1)
    return logits.masked_fill(probs < threshold, float("-inf"))


def sample_inverse_cdf(logits: torch.Tensor, uniforms: torch.Tensor) -> torch.LongTensor:
    """One token per row from softmax(logits) `(B, V)`, picked by the uniform draw `(B,)` on the CDF."""
    cdf = logits.double().softmax(dim=-1).cumsum(dim=-1)  # (B, V)
    targets = (uniforms.double() * cdf[:, -1]).unsqueeze(-1)  # (B, 1)
    tokens = torch.searchsorted(cdf, targets, right=True).squeeze(-1)
    return tokens.clamp(max=logits.size(-1) - 1)


def next_tokens(
    logits: torch.Tensor,
    seen: torch.Tensor | None,
    sampling: SamplingParams,
    uniforms: torch.Tensor | None,
) -> torch.LongTensor:
    """`(B, V)` float logits -> `(B,)` tokens: penalty, then greedy or filtered inverse-CDF on
    `uniforms` `(B,)` (unused, and may be None, when greedy)."""
    if seen is not None:
        logits = apply_repetition_penalty(logits, seen, sampling.repetition_penalty)
    if sampling.suppress_tokens:
        suppressed = torch.tensor(sampling.suppress_tokens, dtype=torch.long, device=logits.device)
        logits = logits.index_fill(-1, suppressed, -torch.inf)
    if sampling.greedy:
        return logits.argmax(dim=-1)
    filtered = filter_top_k_top_p(logits / sampling.temperature, sampling.top_k, sampling.top_p)
    filtered = filter_min_p(filtered, sampling.min_p)
    return sample_inverse_cdf(filtered, uniforms)
