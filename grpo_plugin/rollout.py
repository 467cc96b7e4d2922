"""Group sampling for GRPO: G completions per prompt, with the prompt prefilled once per group.

`generate_groups` is a small decode loop of our own (not `model.generate`):

- prompts are left-padded; position ids come from the attention mask, as in HF generation;
- with `share_prompt_prefix`, each distinct prompt is prefilled ONCE (P rows) and its KV cache is
  expanded to its G rows with `Cache.batch_repeat_interleave`; TRL without vLLM prefills N = P*G
  rows (the same prompt G times);
- sampling follows HF's processor order: repetition penalty, temperature, top-k, top-p;
- randomness is one uniform per row per step from `generator`, turned into a token by inverse-CDF.
  Shared and plain paths therefore consume identical draws and give identical tokens, which is
  what makes prefix sharing testable as exact (HF's `torch.multinomial` draws differ per path);
- decoding stops at ANY eos id and the loop ends as soon as every row has finished.

Departures from HF/TRL: the repetition penalty only counts real prompt tokens (HF also counts the
left padding), and `temperature == 0` means greedy.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)
_warned: set[str] = set()


@dataclass
class RolloutBatch:
    """G sampled completions for each of P prompts; row p*G + g is sample g of prompt p."""

    prompt_ids: torch.LongTensor  # (N, Lp) left-padded
    prompt_mask: torch.LongTensor  # (N, Lp)
    completion_ids: torch.LongTensor  # (N, Tc) right-padded with pad_token_id
    completion_mask: torch.LongTensor  # (N, Tc) 1 up to and including the first EOS
    is_truncated: torch.BoolTensor  # (N,) no EOS within max_new_tokens
    num_prefill_tokens: int  # non-pad prompt tokens run through prefill
    num_generated_tokens: int  # sum of completion_mask


def warn_once(key: str, message: str) -> None:
    """Log `message` as a warning the first time `key` is seen in this process."""
    if key not in _warned:
        _warned.add(key)
        logger.warning(message)


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The underlying transformers model of a peft `PeftModel` (LoRA is injected in its layers)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def keep_bnb_4bit_weights_trainable(model: torch.nn.Module) -> int:
    """Stop bitsandbytes from repacking 4-bit weights for CPU inference; returns layers touched.

    bitsandbytes 0.50 on a CPU with AVX512-BF16 permanently repacks a `Linear4bit` the first time
    it runs in eval mode without grad (generation, old/ref log-probs). The repacked layer goes
    through `gemv_4bit`, which has no autograd kernel: gradients through the frozen 4-bit layers
    are then silently dropped (measured: LoRA grads 68% off) and its absmax is rounded to bf16.
    Called by `generate_groups` and `completion_logprobs`; already-packed layers are unpacked.
    """
    touched = 0
    for module in model.modules():
        if not hasattr(module, "support_avx512bf16_for_cpu"):
            continue
        module.support_avx512bf16_for_cpu = False
        touched += 1
        weight = getattr(module, "weight", None)
        state = getattr(weight, "quant_state", None)
        if state is not None and getattr(state, "packing_format_for_cpu", False):
            from bitsandbytes.functional import _convert_weight_packed_for_cpu_inverse

            weight.data, state = _convert_weight_packed_for_cpu_inverse(weight.data, state)
            if state.absmax.dim() == 2:  # bnb leaves a non-nested absmax transposed (N/bs, ...)
                state.absmax = state.absmax.T.reshape(-1).float().contiguous()
            weight.quant_state = state
            warn_once(
                "bnb-unpack",
                "bitsandbytes had repacked 4-bit weights for CPU inference (eval-mode pass); "
                "unpacked them so gradients flow again. Their absmax is now rounded to bf16.",
            )
    return touched


def cache_argument_name(module: torch.nn.Module) -> str:
    """transformers 5.x calls the KV-cache argument `cache`; older models use `past_key_values`."""
    params = inspect.signature(module.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def output_cache(outputs) -> object | None:
    """The KV cache returned by a forward pass, whatever its attribute is called."""
    cache = getattr(outputs, "cache", None)
    return cache if cache is not None else getattr(outputs, "past_key_values", None)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.LongTensor:
    """Positions that skip left padding, as HF generation computes them."""
    positions = attention_mask.long().cumsum(-1) - 1  # (B, L)
    return positions.clamp(min=0)


def left_pad(
    sequences: list[list[int]], pad_token_id: int, device: torch.device
) -> tuple[torch.LongTensor, torch.LongTensor]:
    """Left-pad token lists into `(ids, mask)`, both `(B, max_len)`."""
    width = max(len(seq) for seq in sequences)
    ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            mask[row, width - len(seq) :] = 1
    return ids.to(device), mask.to(device)


def expand_cache(cache, repeats: int) -> bool:
    """Repeat every cached key/value `repeats` times along the batch (in place); False if unsupported."""
    if repeats == 1:
        return True
    expand = getattr(cache, "batch_repeat_interleave", None)
    if expand is None:
        return False
    try:
        expand(repeats)
    except (NotImplementedError, ValueError, AttributeError, TypeError):
        return False
    return True


def _validate(
    prompt_ids, num_generations, max_new_tokens, eos_token_ids, temperature, top_p, top_k, penalty
):
    if not prompt_ids or any(len(p) == 0 for p in prompt_ids):
        raise ValueError("prompt_ids must be a non-empty list of non-empty token-id lists.")
    if num_generations < 1:
        raise ValueError(f"num_generations must be >= 1, got {num_generations}.")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
    if len(eos_token_ids) == 0:
        raise ValueError(
            "eos_token_ids is empty: pass the tokenizer's eos id (and e.g. <|im_end|>)."
        )
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}.")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}.")
    if top_k is not None and top_k < 0:
        raise ValueError(f"top_k must be None, 0 (off) or positive, got {top_k}.")
    if penalty <= 0:
        raise ValueError(f"repetition_penalty must be > 0 (1.0 = off), got {penalty}.")


class _Decoder:
    """Runs the causal LM forward with an explicit cache and returns last-position float32 logits."""

    def __init__(self, model: torch.nn.Module):
        self.model = unwrap_model(model)
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


def apply_repetition_penalty(
    logits: torch.Tensor, seen: torch.Tensor, penalty: float
) -> torch.Tensor:
    """HF's CTRL-style penalty: seen tokens' logits are divided by `penalty` (multiplied if < 0)."""
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


def sample_inverse_cdf(logits: torch.Tensor, uniforms: torch.Tensor) -> torch.LongTensor:
    """One token per row from softmax(logits), picked by the uniform draw `(B,)` on the CDF."""
    cdf = logits.double().softmax(dim=-1).cumsum(dim=-1)  # (B, V)
    targets = (uniforms.double() * cdf[:, -1]).unsqueeze(-1)  # (B, 1)
    tokens = torch.searchsorted(cdf, targets, right=True).squeeze(-1)
    return tokens.clamp(max=logits.size(-1) - 1)


def _draw_uniforms(rows: int, generator: torch.Generator | None, device: torch.device):
    gen_device = generator.device if generator is not None else device
    return torch.rand(rows, generator=generator, device=gen_device).to(device)


def _can_select(cache) -> bool:
    """Whether the KV cache can drop rows (transformers' `batch_select_indices`)."""
    return callable(getattr(cache, "batch_select_indices", None))


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


@dataclass(frozen=True)
class _Sampling:
    temperature: float
    top_p: float
    top_k: int | None
    repetition_penalty: float
    generator: torch.Generator | None


def _next_tokens(logits: torch.Tensor, seen: torch.Tensor | None, sampling: _Sampling):
    """Penalty, then greedy or temperature/top-k/top-p sampling with one uniform per row."""
    if seen is not None:
        logits = apply_repetition_penalty(logits, seen, sampling.repetition_penalty)
    if sampling.temperature == 0:
        return logits.argmax(dim=-1)
    filtered = filter_top_k_top_p(logits / sampling.temperature, sampling.top_k, sampling.top_p)
    uniforms = _draw_uniforms(logits.size(0), sampling.generator, logits.device)
    return sample_inverse_cdf(filtered, uniforms)


def generate_groups(
    model: torch.nn.Module,
    prompt_ids: list[list[int]],
    *,
    num_generations: int,
    max_new_tokens: int,
    eos_token_ids: Sequence[int],
    pad_token_id: int | None,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int | None = None,
    repetition_penalty: float = 1.0,
    share_prompt_prefix: bool = True,
    generator: torch.Generator | None = None,
) -> RolloutBatch:
    """Sample `num_generations` completions for each prompt (rows p*G .. p*G+G-1 share prompt p).

    Runs under `torch.inference_mode`; the returned tensors are ordinary (cloned) tensors, so they
    can feed a forward pass with grad. `pad_token_id=None` falls back to the first eos id (models
    without a pad token). The model's train/eval mode is left as it is.
    """
    eos_token_ids = list(eos_token_ids)
    _validate(prompt_ids, num_generations, max_new_tokens, eos_token_ids, temperature, top_p, top_k, repetition_penalty)  # fmt: skip
    sampling = _Sampling(temperature, top_p, top_k, repetition_penalty, generator)
    pad_id = eos_token_ids[0] if pad_token_id is None else int(pad_token_id)
    keep_bnb_4bit_weights_trainable(model)
    batch = _generate(model, prompt_ids, num_generations, max_new_tokens, eos_token_ids, pad_id, sampling, share_prompt_prefix)  # fmt: skip
    for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "is_truncated"):
        setattr(batch, name, getattr(batch, name).clone())  # inference tensors -> normal tensors
    return batch


@torch.inference_mode()
def _generate(model, prompt_ids, group, max_new_tokens, eos_token_ids, pad_id, sampling, share):
    device = next(unwrap_model(model).parameters()).device
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
    for step in range(max_new_tokens):
        picked = _next_tokens(logits, seen, sampling)  # (A,)
        step_tokens = torch.full((rows,), pad_id, dtype=picked.dtype, device=device)
        step_tokens[active] = picked
        step_tokens = step_tokens.masked_fill(finished, pad_id)  # (N,)
        tokens.append(step_tokens)
        live.append(~finished)
        finished = finished | torch.isin(step_tokens, eos)
        if bool(finished.all()) or step == max_new_tokens - 1:
            break
        done = finished[active]  # (A,)
        if seen is not None:
            seen.scatter_(1, picked.unsqueeze(-1), True)
        if int(done.sum()) * 4 >= len(active) and _can_select(cache):
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
