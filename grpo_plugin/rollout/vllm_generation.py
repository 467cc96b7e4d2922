"""Group sampling through the vLLM engine (`engine/vllm_engine.py`, `use_vllm=True`).

The same request in, the same `RolloutBatch` out as our own loop (`generation.generate_groups`):
G completions per prompt, each ending at ANY eos id (included, as in our loop) or cut at
`max_new_tokens` (`is_truncated`), and the sampled tokens' log-probs under the engine
(`sampling_logps`, temperature applied and nothing else when top-k/top-p are off: vLLM's
'processed' log-probs, which TRL reads too; with top-k or top-p on, vLLM renormalises them over
the kept tokens, as TRL's vLLM path does).

vLLM draws its own randomness: prompt p's G completions are seeded with `seeds[p] + i`, where
`seeds[p]` comes from the rollout's keyed draws for that prompt (`noise.py`), so a resumed run
seeds each prompt as the uninterrupted run did. Sampling is exactly ours only in distribution:
vLLM's kernels and sampler are its own.
"""

from __future__ import annotations

import torch

from ..core.tensors import left_pad, right_pad
from ..engine.vllm_engine import VllmEngine
from .noise import GeneratorNoise, KeyedNoise
from .types import GenerationRequest, RolloutBatch

SEED_SPAN = 1 << 24  # a uniform's 24 bits of mantissa: one seed per float32 draw


def vllm_sampling(request: GenerationRequest) -> dict:
    """vLLM's `SamplingParams` fields for `request` (G completions per prompt)."""
    s = request.sampling
    return {
        "n": request.num_generations,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k or 0,
        "min_p": s.min_p or 0.0,
        "repetition_penalty": s.repetition_penalty,
        "max_tokens": s.max_new_tokens,
        "stop_token_ids": list(request.eos_token_ids),
        "logprobs": 0 if request.record_logprobs else None,
    }


def prompt_seeds(request: GenerationRequest, prompts: int) -> list[int]:
    """One seed per prompt, spaced G apart (vLLM seeds completion i with seed + i)."""
    group, noise = request.num_generations, request.noise
    if isinstance(noise, KeyedNoise):  # (N, T): the first draw of each prompt's first row
        firsts = noise.table[::group, 0].double().cpu()  # (P,)
        return [int(u * SEED_SPAN) * group for u in firsts.tolist()]
    generator = noise.generator if isinstance(noise, GeneratorNoise) else request.generator
    draws = torch.randint(0, SEED_SPAN, (prompts,), generator=generator)
    return [int(d) * group for d in draws]


def generate_groups_vllm(
    engine: VllmEngine, prompt_ids: list[list[int]], request: GenerationRequest
) -> RolloutBatch:
    """`generation.generate_groups` through vLLM (rows p*G .. p*G+G-1 are prompt p's)."""
    if request.sampling.suppress_tokens:
        raise ValueError("suppress_tokens with use_vllm is not supported; leave it unset.")
    room = engine.settings.max_model_len - request.sampling.max_new_tokens
    for i, ids in enumerate(prompt_ids):
        if len(ids) > room:
            raise ValueError(
                f"prompt {i} of this batch has {len(ids)} tokens, and with max_completion_length "
                f"{request.sampling.max_new_tokens} the vLLM engine holds {room}: set "
                f"max_prompt_length to at most {room} (or raise vllm_max_model_length)."
            )
    groups = engine.generate(
        prompt_ids, vllm_sampling(request), prompt_seeds(request, len(prompt_ids))
    )
    samples = [sample for group in groups for sample in group]
    repeated = [p for p in prompt_ids for _ in range(request.num_generations)]
    p_ids, p_mask = left_pad(repeated, request.pad_id)  # (N, Lp)
    c_ids, c_mask = right_pad([s.token_ids for s in samples], request.pad_id)  # (N, Tc)
    logps, _ = right_pad([s.logprobs for s in samples], 0.0, torch.float32)  # (N, Tc)
    return RolloutBatch(
        prompt_ids=p_ids,
        prompt_mask=p_mask,
        completion_ids=c_ids,
        completion_mask=c_mask,
        is_truncated=torch.tensor([not s.finished for s in samples]),
        num_prefill_tokens=int(p_mask.sum()),
        num_generated_tokens=int(c_mask.sum()),
        sampling_logps=logps if request.record_logprobs else None,
    )
