"""Group sampling for GRPO: G completions per prompt, with the prompt prefilled once per group.

`generate_groups` is a small decode loop of our own (not `model.generate`):

- prompts are left-padded; position ids come from the attention mask, as in HF generation;
- with `share_prompt_prefix`, each distinct prompt is prefilled ONCE (P rows) and its KV cache is
  expanded to its G rows (lever `shared_prefill`, `engine/decode.py`); TRL without vLLM prefills
  N = P*G rows (the same prompt G times);
- next tokens are chosen by `sampler.next_tokens` (HF's processor order, one uniform per row per
  step from a noise source, `noise.py`: keyed on the prompt for training, so a row's draws never
  depend on the batch layout);
- decoding stops at ANY eos id, finished rows leave the batch (and the KV cache) once they are a
  quarter of it, and the loop ends as soon as every row has finished.

Every forward and every change to the KV cache goes through the engine's decoder
(`engine/decode.py`: the prefill with prefix sharing, the step, dropping rows); with
`DecodeSettings.static` (`cache_implementation='static'`, `compile_decode`) the engine's static
decoder runs the loop of `static_decode.py` instead: a preallocated cache, every row kept, fixed
shapes.

The pieces are public for the multi-turn tool loop (`multiturn.py`): `prefill_and_decode` (with
`DecodeSpec.drop_finished=False` every row stays in the cache), `continue_decoding` (prefill only the tokens
appended to some cached rows, then decode them) and `decode` (the loop itself). They talk to
the cache through transformers' Cache API only (`batch_repeat_interleave`,
`batch_select_indices`, `get_seq_length` and the model's own `update`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from .._compat import keep_bnb_4bit_weights_trainable
from ..core.tensors import left_pad, position_ids_from_mask
from ..engine.decode import Decoder
from ..engine.vllm_engine import VllmEngine
from .noise import GeneratorNoise
from .replaced_generate import generate_groups_with, replaced_generate
from .sampler import DecodeTrace
from .static_decode import decode_static
from .types import Decoded, DecodeSpec, GenerationRequest, RolloutBatch
from .vllm_generation import generate_groups_vllm


def _check_prompts(prompt_ids: list[list[int]]) -> None:
    if not prompt_ids or any(len(p) == 0 for p in prompt_ids):
        raise ValueError("prompt_ids must be a non-empty list of non-empty token-id lists.")


def decode_spec(request: GenerationRequest) -> DecodeSpec:
    """The decode settings of `request`: pad id resolved, noise from `noise` or `generator`."""
    noise = request.noise if request.noise is not None else GeneratorNoise(request.generator)
    return DecodeSpec(
        sampling=request.sampling,
        eos_token_ids=request.eos_token_ids,
        pad_token_id=request.pad_id,
        noise=noise,
        record_logprobs=request.record_logprobs,
        on_step=request.on_step,
        engine=request.engine,
    )


def generate_groups(
    model: torch.nn.Module, prompt_ids: list[list[int]], request: GenerationRequest
) -> RolloutBatch:
    """Sample `request.num_generations` completions for each prompt (rows p*G .. p*G+G-1 share
    prompt p).

    Runs under `torch.inference_mode`; the returned tensors are ordinary (cloned) tensors, so they
    can feed a forward pass with grad. The model's train/eval mode is left as it is. The sampling
    uniforms come from `request.noise` (one row per completion, e.g. `KeyedNoise`), else from
    `request.generator` in call order; `request.on_step` runs after every decode step.
    """
    _check_prompts(prompt_ids)
    if isinstance(model, VllmEngine):  # use_vllm: the engine samples (vllm_generation.py)
        return generate_groups_vllm(model, prompt_ids, request)
    keep_bnb_4bit_weights_trainable(model)
    replaced = replaced_generate(model)
    if replaced is not None:  # user code replaced model.generate: honour it (replaced_generate.py)
        return generate_groups_with(replaced, prompt_ids, request)
    batch = _generate(model, prompt_ids, request, decode_spec(request))
    for name in batch.row_fields():
        setattr(batch, name, getattr(batch, name).clone())  # inference tensors -> normal tensors
    return batch


@torch.inference_mode()
def _generate(model, prompt_ids, request: GenerationRequest, spec: DecodeSpec) -> RolloutBatch:
    group, share = request.num_generations, request.share_prompt_prefix
    ids, mask, out, prefilled = prefill_and_decode(model, prompt_ids, group, spec, share)
    completion_mask = out.live.long()  # (N, Tc)
    return RolloutBatch(
        prompt_ids=ids,
        prompt_mask=mask,
        completion_ids=out.tokens,  # (N, Tc)
        completion_mask=completion_mask,
        is_truncated=~out.finished,
        num_prefill_tokens=prefilled,
        num_generated_tokens=int(completion_mask.sum()),
        sampling_logps=out.logprobs,  # (N, Tc) with `record_logprobs`, else None
    )


@torch.inference_mode()
def prefill_and_decode(
    model: torch.nn.Module,
    prompt_ids: list[list[int]],
    group: int,
    spec: DecodeSpec,
    share: bool = True,
) -> tuple[torch.LongTensor, torch.LongTensor, Decoded, int]:
    """Prefill the P prompts (once per group with `share`) and decode their N = P * G rows:
    `(prompt ids (N, Lp), prompt mask (N, Lp), Decoded, prefilled tokens)`. The multi-turn loop
    keeps every row in the cache (`spec.drop_finished=False`) to continue it after a tool call."""
    decoder = Decoder(model, spec.engine)  # every forward and cache change of this decode
    device = decoder.device
    spec = replace(spec, noise=spec.noise.to(device))
    unique_ids, unique_mask = left_pad(prompt_ids, spec.pad_token_id, device)  # (P, Lp)
    ids = unique_ids.repeat_interleave(group, 0)  # (N, Lp)
    mask = unique_mask.repeat_interleave(group, 0)  # (N, Lp)
    logits, cache, prefilled = decoder.prefill(unique_ids, unique_mask, group, share)
    seen = None
    if spec.sampling.repetition_penalty != 1.0:
        seen = torch.zeros(logits.shape, dtype=torch.bool, device=device)  # (N, V)
        seen.scatter_(1, ids, mask.bool())  # pad columns scatter False: only real tokens count
    static = (
        decoder.static(logits, cache, mask, spec.sampling.max_new_tokens)
        if spec.engine.static
        else None
    )
    if static is not None:
        out = decode_static(static, logits, mask, spec, seen)
    else:
        out = decode(decoder, logits, cache, mask, spec, seen)
    return ids, mask, out, prefilled


@torch.inference_mode()
def continue_decoding(
    model: torch.nn.Module,
    cache: Any,
    attention: torch.LongTensor,
    appended: tuple[torch.LongTensor, torch.LongTensor],
    spec: DecodeSpec,
    seen: torch.Tensor | None = None,
) -> Decoded:
    """Continue A cached rows after new tokens (a tool result and the template glue around it).

    `cache` holds exactly these A rows and `attention` `(A, W)` says which of its columns each
    row attends to. Only `appended = (ids, mask)`, `(A, B)` each, are prefilled (left-padded
    inside the block, as `left_pad` returns them: the mask is 0 on the padding), then the rows
    decode as in `decode`, every row kept in the cache (whatever `spec.drop_finished` says).
    Positions come from the mask, so each row continues at its own length.
    """
    appended_ids, appended_mask = appended
    decoder = Decoder(model, spec.engine)
    attention = torch.cat([attention, appended_mask], dim=1)  # (A, W + B)
    positions = position_ids_from_mask(attention)[:, -appended_ids.shape[1] :]  # (A, B)
    logits, cache = decoder(appended_ids, attention, positions, cache)
    spec = replace(spec, drop_finished=False)
    return decode(decoder, logits, cache, attention, spec, seen)


def decode(
    decoder: Decoder,
    logits: torch.Tensor,
    cache: Any,
    attention: torch.LongTensor,
    spec: DecodeSpec,
    seen: torch.Tensor | None = None,
) -> Decoded:
    """The decode loop over A rows, from the last-position `logits` `(A, V)` of what `cache` holds
    (`attention` `(A, W)`). Rows stop at any eos id; with `spec.drop_finished`, finished rows
    leave the batch and the cache once they are a quarter of it. Row a reads
    `spec.noise.uniforms([a], t)`. `spec.on_step(finished (N,), tokens, live)` runs after each
    step: the step tensors so far, (N,) each (overlapped scoring reads the rows that have
    finished). `seen` `(A, V)` (the repetition penalty's tokens so far) is updated in place."""
    rows, device = logits.shape[0], logits.device
    trace = DecodeTrace(rows, spec, device)
    # The decode loop runs on the `active` rows only: finished rows are dropped from the batch
    # (and the KV cache) once they make up a quarter of it, so short completions stop costing.
    active = torch.arange(rows, device=device)  # (A,) row index of each decoded row
    first_position = attention.sum(-1)  # (A,) position of each row's next token
    drop = spec.drop_finished and decoder.can_drop_rows(cache)
    for step in range(spec.sampling.max_new_tokens):
        picked = trace.step(logits, seen, active, step)  # (A,)
        if bool(trace.finished.all()) or step == spec.sampling.max_new_tokens - 1:
            break
        done = trace.finished[active]  # (A,)
        if seen is not None:
            seen.scatter_(1, picked.unsqueeze(-1), True)
        if drop and int(done.sum()) * 4 >= len(active):
            keep = (~done).nonzero().squeeze(-1)  # (A',)
            decoder.keep_rows(cache, keep)
            active, attention, first_position = active[keep], attention[keep], first_position[keep]
            picked = picked[keep]
            seen = seen[keep] if seen is not None else None
        attention = torch.cat([attention, attention.new_ones(len(active), 1)], dim=-1)
        positions = (first_position + step).unsqueeze(-1)  # (A, 1)
        logits, cache = decoder(picked.unsqueeze(-1), attention, positions, cache)
    return trace.decoded(cache, attention)
