"""Prompts in, completions out: the tokenizer-side glue shared by training and evaluation.

Chat prompts (lists of messages) go through the tokenizer's chat template with the generation
prompt and no extra special tokens (as TRL); plain strings are tokenized as they are. Completions
come back as strings for string prompts and as `[{"role": "assistant", "content": ...}]` for chat
prompts, which is what TRL-style reward functions expect. With tools (`multiturn.ToolSetup`) the
prompts are rendered with the tools' schemas and a completion is the whole exchange, as TRL
passes it: assistant turns (with their `tool_calls`) and `tool` results.
"""

from __future__ import annotations

from typing import Any

from ..engine.decode import DecodeSettings
from .generation import generate_groups
from .multiturn import pack, run_tool_loop
from .noise import SamplingNoise
from .types import GenerationRequest, GroupSampling, Rollout, RolloutBatch, StepHook


def prompt_problem(prompt: Any) -> str | None:
    """Why `prompt` cannot be sampled from, or None when it can."""
    if isinstance(prompt, str):
        return None if prompt.strip() else "is an empty string"
    if isinstance(prompt, list):
        if not prompt:
            return "is an empty list of messages"
        for message in prompt:
            if not isinstance(message, dict) or "role" not in message or "content" not in message:
                return f"has a message that is not {{'role': ..., 'content': ...}}: {message!r:.60}"
        return None
    kind = type(prompt).__name__
    article = "an" if kind[:1] in "aeiouAEIOU" else "a"
    return f"is {article} {kind} ({prompt!r:.60}), not a string or a list of messages"


def encode_prompts(
    tokenizer,
    prompts: list[Any],
    *,
    max_prompt_length: int | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[list[int]]:
    """Token ids of each prompt, keeping the last `max_prompt_length` tokens when set."""
    encoded = []
    for i, prompt in enumerate(prompts):
        problem = prompt_problem(prompt)
        if problem is not None:  # a streamed dataset's rows are first seen here
            raise ValueError(f"prompt {i} of this batch {problem}; fix or drop that row.")
        if isinstance(prompt, list):
            text = tokenizer.apply_chat_template(
                prompt, tokenize=False, add_generation_prompt=True, **(chat_template_kwargs or {})
            )
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            ids = tokenizer(prompt)["input_ids"]
        encoded.append(ids[-max_prompt_length:] if max_prompt_length else ids)
    return encoded


def decode_completions(
    tokenizer, prompts: list[Any], batch: RolloutBatch
) -> tuple[list[Any], list[list[int]]]:
    """(completions, completion token ids) for a `RolloutBatch`; padding after EOS is dropped."""
    ids = [row[m.bool()].tolist() for row, m in zip(batch.completion_ids, batch.completion_mask)]
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    completions = [
        [{"role": "assistant", "content": t}] if isinstance(p, list) else t
        for p, t in zip(prompts, texts)
    ]
    return completions, ids


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS and the generation config's."""
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    return sorted(i for i in ids if i is not None)


def sample_groups(
    model,
    tokenizer,
    rows: list[dict[str, Any]],
    settings: GroupSampling,
    *,
    noise: SamplingNoise | None = None,
    on_step: StepHook | None = None,
) -> Rollout:
    """Sample G = `settings.num_generations` completions for each dataset row and decode them (an
    unscored `Rollout`); with `settings.tools`, G multi-turn exchanges (`multiturn.py`). The draws
    come from `noise` (None: torch's global generator, in call order). `on_step` (single-turn
    only) is called after each decode step (`generation.decode`)."""
    if settings.tools is not None:
        return _sample_with_tools(model, tokenizer, rows, settings, noise)
    prompt_ids = encode_prompts(
        tokenizer,
        [r["prompt"] for r in rows],
        max_prompt_length=settings.max_prompt_length,
        chat_template_kwargs=settings.chat_template_kwargs,
    )
    request = GenerationRequest(
        sampling=settings.sampling,
        num_generations=settings.num_generations,
        eos_token_ids=eos_token_ids(model, tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        share_prompt_prefix=settings.share_prompt_prefix,
        noise=noise,
        on_step=on_step,
        record_logprobs=settings.record_logprobs,
        engine=settings.engine,
    )
    batch = generate_groups(model, prompt_ids, request)
    repeated = [r for r in rows for _ in range(settings.num_generations)]
    prompts = [r["prompt"] for r in repeated]
    completions, ids = decode_completions(tokenizer, prompts, batch)
    columns = {k: [r[k] for r in repeated] for k in rows[0] if k != "prompt"}
    return Rollout(rows, batch, prompts, completions, ids, columns)


def _sample_with_tools(model, tokenizer, rows, settings: GroupSampling, noise) -> Rollout:
    setup, group = settings.tools, settings.num_generations
    max_prompt_length, template_kwargs = settings.max_prompt_length, settings.chat_template_kwargs
    repeated = [r for r in rows for _ in range(group)]
    prompts, boxes, environments = setup.start(repeated)
    prompt_ids = []
    for prompt, box in zip(prompts, boxes):
        schemas = [tool.schema for tool in box.values()]
        ids = setup.format.render_prompt(tokenizer, prompt, schemas, template_kwargs)
        prompt_ids.append(ids[-max_prompt_length:] if max_prompt_length else ids)
    eos = sorted(set(eos_token_ids(model, tokenizer)) | set(setup.format.stop_token_ids(tokenizer)))
    pad = eos[0] if tokenizer.pad_token_id is None else tokenizer.pad_token_id
    request = GenerationRequest(
        sampling=settings.sampling,
        num_generations=group,
        eos_token_ids=eos,
        pad_token_id=pad,
        share_prompt_prefix=settings.share_prompt_prefix,
        noise=noise,
        record_logprobs=settings.record_logprobs,
        # the dynamic loop (tool results of unknown length join the cache), prefix sharing kept
        engine=DecodeSettings(shared_prefill=settings.engine.shared_prefill),
    )
    result = run_tool_loop(model, tokenizer, prompt_ids, boxes, setup, request)
    completions = [t.messages for t in result.trajectories]
    ids = [t.ids for t in result.trajectories]
    columns = {k: [r[k] for r in repeated] for k in rows[0] if k != "prompt"}
    batch = pack(result, pad)
    return Rollout(rows, batch, prompts, completions, ids, columns, environments=environments)
