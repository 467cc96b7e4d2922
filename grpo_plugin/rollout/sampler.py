"""Next-token selection: repetition penalty, suppressed tokens, temperature, top-k, top-p, min-p,
then one uniform per row.

Randomness is one uniform per row per step, given by the caller (see `noise.py`), turned into a
token by inverse-CDF. Paths that decode the same rows in a different layout (prefix-shared or
not, rows dropped from the batch or not) therefore get identical draws and pick identical tokens,
which is what makes those optimisations testable as exact (HF's `torch.multinomial` draws differ).

The CDF is a running sum of `exp(logit - max)` in float64, in vocabulary order, left
unnormalised (the draw is compared with `u` times its last value). A running sum only has
prefixes, and removed tokens (-inf) add exact zeros, so the same draw picks the same token
whether the sum runs over the whole vocabulary or over a compact list of candidates.

Fast path (`next_tokens(..., fast=True)`, the default): with top-k and/or top-p (and no min-p)
the filters run on the `torch.topk` candidates instead of sorting the whole vocabulary (a sort of
49k logits per row costs more than a decode step of a 135M model on a CPU), and the draw runs on
the candidates. Top-p without top-k tries 64, then 1024 candidates and falls back to the full
sort when they do not hold the top-p mass. Both paths compute every number that decides a token
with the same operations on the same values, so they pick the same tokens for the same draws
(`tests/rollout/test_sampler.py` checks it on ties, boundary draws and random logits).

Departures from HF: the repetition penalty only counts real prompt tokens (HF also counts the
left padding). Top-p keeps a token when the probability of the tokens ranked strictly above it
is below `top_p` (HF's rule), computed in float64, with tied logits kept or dropped together (HF
keeps an arbitrary subset of a tie); HF sums float32 probabilities, so the two can differ when a
cumulative mass is within float32 rounding of `top_p`.
"""

from __future__ import annotations

import torch

from .types import Decoded, DecodeSpec, SamplingParams

CANDIDATE_BUDGETS = (64, 1024)  # top-p candidates tried before the full-vocabulary sort


def apply_repetition_penalty(
    logits: torch.Tensor, seen: torch.Tensor, penalty: float
) -> torch.Tensor:
    """HF's CTRL-style penalty on `(B, V)` logits: seen tokens' logits are divided by `penalty`
    (multiplied when negative)."""
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, penalised, logits)


def _weights(logits: torch.Tensor, row_max: torch.Tensor) -> torch.Tensor:
    """`exp(logit - max)` in float64 (0 for -inf)."""
    return (logits.double() - row_max.double()).exp()


def _vocab_mass(logits: torch.Tensor) -> torch.Tensor:
    """`(B, 1)` sum over the whole vocabulary of `exp(logit - max)` (top-p's total without top-k)."""
    return _weights(logits, logits.amax(-1, keepdim=True)).sum(-1, keepdim=True)


def _top_p_keep(ranked: torch.Tensor, total: torch.Tensor | None, top_p: float) -> torch.Tensor:
    """Top-p on logits ranked in descending order `(B, K)`: keep a token when the mass of the
    tokens ranked strictly above it is below `top_p` times `total` `(B, 1)` (None: the mass of
    `ranked` itself, for top-k survivors). Returns `(B, K)` bool."""
    weights = _weights(ranked, ranked[:, :1])  # (B, K); ranked[:, 0] is the row max
    running = weights.cumsum(-1)
    before = running - weights  # mass ranked above each position
    negated = -ranked.double().contiguous()  # ascending: a tie's first position by searchsorted
    tie_start = torch.searchsorted(negated, negated, right=False)
    before = before.gather(-1, tie_start)  # ties share the mass ranked strictly above them
    total = running[:, -1:] if total is None else total
    return before < top_p * total


def filter_top_k_top_p(logits: torch.Tensor, top_k: int | None, top_p: float) -> torch.Tensor:
    """HF's TopK then TopP warpers on `(B, V)` logits (removed entries become -inf), with a full
    sort of the vocabulary (the reference path)."""
    if top_k:
        kth_best = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_best, float("-inf"))
    if top_p < 1.0:
        ranked, order = torch.sort(logits, descending=True, dim=-1)
        total = None if top_k else _vocab_mass(logits)
        keep_ranked = _top_p_keep(ranked, total, top_p)
        keep = torch.zeros_like(keep_ranked).scatter(-1, order, keep_ranked)
        logits = logits.masked_fill(~keep, float("-inf"))
    return logits


def top_k_top_p_candidates(
    logits: torch.Tensor, top_k: int | None, top_p: float
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The fast path of `filter_top_k_top_p`: `(ids (B, K), logits (B, K))` of K candidates per
    row, removed ones at -inf, or None when the candidates cannot decide (a tie at the k-th value
    that may go on past them; top-p mass outside 1024 candidates)."""
    vocab = logits.size(-1)
    budgets = [min(vocab, top_k + 1)] if top_k else [b for b in CANDIDATE_BUDGETS if b < vocab]
    total = None if top_k or top_p >= 1.0 else _vocab_mass(logits)
    for budget in budgets:
        ranked, ids = torch.topk(logits, budget, dim=-1)  # (B, K) descending
        if top_k:
            kth = min(top_k, vocab)
            survivor = ranked >= ranked[:, kth - 1 : kth]  # ties at the k-th value survive
            if budget < vocab and bool(survivor[:, -1].any()):
                return None  # the k-th value's tie may continue past the candidates
            ranked = ranked.masked_fill(~survivor, float("-inf"))
        if top_p < 1.0:
            keep = _top_p_keep(ranked, total, top_p)
            if not top_k and budget < vocab and bool(keep[:, -1].any()):
                continue  # the kept mass may continue past the candidates: more of them
            ranked = ranked.masked_fill(~keep, float("-inf"))
        return ids, ranked
    return None


def filter_min_p(logits: torch.Tensor, min_p: float | None) -> torch.Tensor:
    """HF's MinP warper on `(B, V)` logits: drop tokens whose probability is below `min_p` times the
    most likely token's (which is always kept)."""
    if not min_p:
        return logits
    probs = logits.softmax(dim=-1)  # (B, V)
    threshold = min_p * probs.max(dim=-1, keepdim=True).values  # (B, 1)
    return logits.masked_fill(probs < threshold, float("-inf"))


def sample_inverse_cdf(logits: torch.Tensor, uniforms: torch.Tensor) -> torch.LongTensor:
    """One token per row from softmax(logits) `(B, V)`, picked by the uniform draw `(B,)` on the CDF
    (the running sum of `exp(logit - max)`, see the module docstring)."""
    cdf = _weights(logits, logits.amax(-1, keepdim=True)).cumsum(dim=-1)  # (B, V)
    targets = (uniforms.double() * cdf[:, -1]).unsqueeze(-1)  # (B, 1)
    tokens = torch.searchsorted(cdf, targets, right=True).squeeze(-1)
    return tokens.clamp(max=logits.size(-1) - 1)


def _sample_candidates(ids: torch.Tensor, logits: torch.Tensor, uniforms: torch.Tensor):
    """`sample_inverse_cdf` over candidates `(B, K)`, put back in vocabulary order."""
    vocab_order, position = ids.sort(dim=-1)
    picked = sample_inverse_cdf(logits.gather(-1, position), uniforms)  # (B,)
    return vocab_order.gather(-1, picked.unsqueeze(-1)).squeeze(-1)


def next_tokens(
    logits: torch.Tensor,
    seen: torch.Tensor | None,
    sampling: SamplingParams,
    uniforms: torch.Tensor | None,
    *,
    fast: bool = True,
) -> torch.LongTensor:
    """`(B, V)` float logits -> `(B,)` tokens: penalty, then greedy or filtered inverse-CDF on
    `uniforms` `(B,)` (unused, and may be None, when greedy). `fast=False` always sorts the whole
    vocabulary for top-k/top-p (the reference path; same tokens)."""
    if seen is not None:
        logits = apply_repetition_penalty(logits, seen, sampling.repetition_penalty)
    if sampling.suppress_tokens:
        suppressed = torch.tensor(sampling.suppress_tokens, dtype=torch.long, device=logits.device)
        logits = logits.index_fill(-1, suppressed, -torch.inf)
    if sampling.greedy:
        return logits.argmax(dim=-1)
    scaled = logits / sampling.temperature if sampling.temperature != 1.0 else logits
    filtering = bool(sampling.top_k) or sampling.top_p < 1.0
    if fast and filtering and not sampling.min_p:
        candidates = top_k_top_p_candidates(scaled, sampling.top_k, sampling.top_p)
        if candidates is not None:
            return _sample_candidates(*candidates, uniforms)
    filtered = filter_top_k_top_p(scaled, sampling.top_k, sampling.top_p)
    filtered = filter_min_p(filtered, sampling.min_p)
    return sample_inverse_cdf(filtered, uniforms)


def picked_logprobs(logits, picked, active, rows, temperature: float) -> torch.Tensor:
    """`(N,)` log-softmax of the logits `(A, V)` over `temperature` (1 when greedy) at the
    picked tokens, 0 for the other rows: the training forward's log-prob of the same token (it
    divides by the temperature too, and filters nothing)."""
    scale = temperature if temperature > 0 else 1.0
    out = torch.zeros(rows, dtype=torch.float32, device=logits.device)
    logps = (logits.float() / scale).log_softmax(-1)  # (A, V)
    out[active] = logps.gather(1, picked.unsqueeze(-1)).squeeze(-1)
    return out


class DecodeTrace:
    """What a decode loop over N rows has sampled so far, one step at a time: the tokens (pad
    after each row's end), which rows were live, the sampled log-probs (`spec.record_logprobs`)
    and which rows have finished. Both loops (`generation.decode`, `static_decode`) step it."""

    def __init__(self, rows: int, spec: DecodeSpec, device: torch.device) -> None:
        self.rows, self.spec = rows, spec
        self.eos = torch.tensor(list(spec.eos_token_ids), device=device)
        self.finished = torch.zeros(rows, dtype=torch.bool, device=device)  # (N,)
        self.tokens: list[torch.Tensor] = []  # (N,) per step
        self.live: list[torch.Tensor] = []  # (N,) per step
        self.logps: list[torch.Tensor] = []  # (N,) per step

    def step(self, logits, seen, active: torch.Tensor, step: int, fast: bool = True):
        """Pick the next token of the `active` rows `(A,)` from their logits `(A, V)`, record the
        step, run `spec.on_step`; returns the picked tokens `(A,)`."""
        sampling, finished = self.spec.sampling, self.finished
        uniforms = None if sampling.greedy else self.spec.noise.uniforms(active, step)  # (A,)
        picked = next_tokens(logits, seen, sampling, uniforms, fast=fast)  # (A,)
        pad = self.spec.pad_token_id
        step_tokens = torch.full((self.rows,), pad, dtype=picked.dtype, device=picked.device)
        step_tokens[active] = picked
        step_tokens = step_tokens.masked_fill(finished, pad)  # (N,)
        self.tokens.append(step_tokens)
        self.live.append(~finished)
        if self.spec.record_logprobs:
            logp = picked_logprobs(logits, picked, active, self.rows, sampling.temperature)
            self.logps.append(logp.masked_fill(finished, 0.0))  # (N,) 0 past a row's end
        self.finished = finished | torch.isin(step_tokens, self.eos)
        if self.spec.on_step is not None:
            self.spec.on_step(self.finished, self.tokens, self.live)
        return picked

    def decoded(self, cache, attention: torch.Tensor, steps: int | None = None) -> Decoded:
        """The run as a `Decoded`, its first `steps` steps (None: all)."""
        logps = torch.stack(self.logps, dim=1)[:, :steps] if self.spec.record_logprobs else None
        return Decoded(
            tokens=torch.stack(self.tokens, dim=1)[:, :steps],  # (N, T)
            live=torch.stack(self.live, dim=1)[:, :steps],
            finished=self.finished,
            cache=cache,
            attention=attention,
            logprobs=logps,
        )
