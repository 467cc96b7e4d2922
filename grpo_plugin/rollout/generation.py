"""Group sampling for GRPO: G completions per prompt, with the prompt prefilled once per group.

`generate_groups` is a small decode loop of our own (not `model.generate`):

- prompts are left-padded; position ids come from the attention mask, as in HF generation;
- with `share_prompt_prefix`, each distinct prompt is prefilled ONCE (P rows) and its KV cache is
  expanded to its G rows with `Cache.batch_repeat_interleave`; TRL without vLLM prefills N = P*G
  rows (the same prompt G times);
- next tokens are chosen by `sampler.next_tokens` (HF's processor order, one uniform per row per
  step from a noise source, `noise.py`: keyed on the prompt for training, so a row's draws never
  depend on the batch layout);
- decoding stops at ANY eos id, finished rows leave the batch (and the KV cache) once they are a
  quarter of it, and the loop ends as soon as every row has finished.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch

from .._compat import (
    cache_argument_name,
    can_drop_cache_rows,
    expand_cache,
    keep_bnb_4bit_weights_trainable,
    output_cache,
    unwrap_peft,
)
from .._logging import warn_once
from ..core.tensors import left_pad, position_ids_from_mask
from .noise import GeneratorNoise, SamplingNoise
from .sampler import next_tokens
from .types import RolloutBatch, SamplingParams


class _Decoder:
    """Runs the causal LM forward with an explicit cache and returns last-position float32 logits."""

    def __init__(self, model: torch.nn.Module):
        self.model = unwrap_peft(model)
        params = inspect.signature(self.model.forward).parameters
        self.cache_arg = cache_argument_name(self.model)
        self.keeps_last_only = "logits_to_keep" in params

    def __call__(self, input_ids, attention_mask, position_ids, cache=None):
        kwargs = {self.cache_arg: cache, "use_cache": True}
        if self.keeps_last_only:
            kwargs["logits_to_keep"] = 1
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs
        )
        return out.logits[:, -1, :].float(), output_cache(out)  # (B, V)


def _prefill(decoder, unique_ids, unique_mask, group_size, share):
    """Prefill the prompts; returns `(last_logits (N, V), cache, prefilled_tokens)`."""
    if share:
        logits, cache = decoder(unique_ids, unique_mask, position_ids_from_mask(unique_mask))
        if cache is not None and expand_cache(cache, group_size):
            return logits.repeat_interleave(group_size, 0), cache, int(unique_mask.sum())
        warn_once(
            "gen-share",
            "share_prompt_prefix: this model's KV cache cannot be expanded along the batch; "
            "prefilling every row instead (slower, same result).",
        )
    ids = unique_ids.repeat_interleave(group_size, 0)
    mask = unique_mask.repeat_interleave(group_size, 0)
    logits, cache = decoder(ids, mask, position_ids_from_mask(mask))
    return logits, cache, int(mask.sum())


def _check_prompts(prompt_ids: list[list[int]], num_generations: int, eos_token_ids: list[int]):
    if not prompt_ids or any(len(p) == 0 for p in prompt_ids):
        raise ValueError("prompt_ids must be a non-empty list of non-empty token-id lists.")
    if num_generations < 1:
        raise ValueError(f"num_generations must be >= 1, got {num_generations}.")
    if len(eos_token_ids) == 0:
        raise ValueError(
            "eos_token_ids is empty: pass the tokenizer's eos id (and e.g. <|im_end|>)."
        )


def generate_groups(
    model: torch.nn.Module,
    prompt_ids: list[list[int]],
    sampling: SamplingParams,
    *,
    num_generations: int,
    eos_token_ids: Sequence[int],
    pad_token_id: int | None,
    share_prompt_prefix: bool = True,
    generator: torch.Generator | None = None,
    noise: SamplingNoise | None = None,
) -> RolloutBatch:
    """Sample `num_generations` completions for each prompt (rows p*G .. p*G+G-1 share prompt p).

    Runs under `torch.inference_mode`; the returned tensors are ordinary (cloned) tensors, so they
    can feed a forward pass with grad. `pad_token_id=None` falls back to the first eos id (models
    without a pad token). The model's train/eval mode is left as it is. The sampling uniforms come
    from `noise` (one row per completion, e.g. `KeyedNoise`), else from `generator` in call order.
    """
    eos_token_ids = list(eos_token_ids)
    _check_prompts(prompt_ids, num_generations, eos_token_ids)
    pad_id = eos_token_ids[0] if pad_token_id is None else int(pad_token_id)
    keep_bnb_4bit_weights_trainable(model)
    noise = noise if noise is not None else GeneratorNoise(generator)
    batch = _generate(
        model,
        prompt_ids,
        num_generations,
        eos_token_ids,
        pad_id,
        sampling,
        noise,
        share_prompt_prefix,
    )
    for name in RolloutBatch.ROW_FIELDS:
        setattr(batch, name, getattr(batch, name).clone())  # inference tensors -> normal tensors
    return batch


@torch.inference_mode()
def _generate(model, prompt_ids, group, eos_token_ids, pad_id, sampling, noise, share):
    device = next(unwrap_peft(model).parameters()).device
    noise = noise.to(device)
    unique_ids, unique_mask = left_pad(prompt_ids, pad_id, device)  # (P, Lp)
    ids = unique_ids.repeat_interleave(group, 0)  # (N, Lp)
    mask = unique_mask.repeat_interleave(group, 0)  # (N, Lp)
    decoder = _Decoder(model)
    logits, cache, prefilled = _prefill(decoder, unique_ids, unique_mask, group, share)

    rows, vocab = logits.shape
    eos = torch.tensor(eos_token_ids, device=device)
    seen = None
    if sampling.repetition_penalty != 1.0:
        seen = torch.zeros(rows, vocab, dtype=torch.bool, device=device)
        seen.scatter_(1, ids, mask.bool())  # pad columns scatter False: only real tokens count
    # The decode loop runs on the `active` rows only: finished rows are dropped from the batch
    # (and the KV cache) once they make up a quarter of it, so short completions stop costing.
    active = torch.arange(rows, device=device)  # (A,) row index of each decoded row
    attention, first_position = mask, mask.sum(-1)  # (A, Lp + t), (A,)
    finished = torch.zeros(rows, dtype=torch.bool, device=device)  # (N,)
    tokens, live = [], []
    for step in range(sampling.max_new_tokens):
        uniforms = None if sampling.greedy else noise.uniforms(active, step)  # (A,)
        picked = next_tokens(logits, seen, sampling, uniforms)  # (A,)
        step_tokens = torch.full((rows,), pad_id, dtype=picked.dtype, device=device)
        step_tokens[active] = picked
        step_tokens = step_tokens.masked_fill(finished, pad_id)  # (N,)
        tokens.append(step_tokens)
        live.append(~finished)
        finished = finished | torch.isin(step_tokens, eos)
        if bool(finished.all()) or step == sampling.max_new_tokens - 1:
            break
        done = finished[active]  # (A,)
        if seen is not None:
            seen.scatter_(1, picked.unsqueeze(-1), True)
        if int(done.sum()) * 4 >= len(active) and can_drop_cache_rows(cache):
            keep = (~done).nonzero().squeeze(-1)  # (A',)
            cache.batch_select_indices(keep)
            active, attention, first_position = active[keep], attention[keep], first_position[keep]
            picked = picked[keep]
            seen = seen[keep] if seen is not None else None
        attention = torch.cat([attention, attention.new_ones(len(active), 1)], dim=-1)
        positions = (first_position + step).unsqueeze(-1)  # (A, 1)
        logits, cache = decoder(picked.unsqueeze(-1), attention, positions, cache)

    completion_mask = torch.stack(live, dim=1).long()  # (N, Tc)
    return RolloutBatch(
        prompt_ids=ids,
        prompt_mask=mask,
        completion_ids=torch.stack(tokens, dim=1),  # (N, Tc)
        completion_mask=completion_mask,
        is_truncated=~finished,
        num_prefill_tokens=prefilled,
        num_generated_tokens=int(completion_mask.sum()),
    )
