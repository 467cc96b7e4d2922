"""Per-token log-probabilities of completions, computed without materialising full-vocab logits.

`completion_logprobs` returns log pi(c_t | prompt, c_<t) for every completion token — the
per-token quantity of the GRPO objective (DeepSeekMath, eq. 3, https://arxiv.org/abs/2402.03300).

- The decoder body runs once over prompt + completion; the LM head then runs ONLY at real
  completion positions (the hidden state at the last prompt token predicts completion token 0),
  `chunk_size` positions at a time, in float32, on `logits / temperature` as TRL does. With grad
  enabled each chunk (head + log-softmax + gather) is wrapped in `torch.utils.checkpoint`, so no
  (N x Tc x V) logits tensor is ever held for backward; a frozen head (LoRA, QLoRA) instead takes
  each position's gradient in the forward (`lm_head.py`: no recompute).
- All-pad prompt columns (left) and completion columns past the longest real completion (right)
  are trimmed before the model runs; results are padded back to (N, Tc) with zeros.
- Prefix-shared forward (`share_prompt_prefix` with `group_size` G): rows p*G .. p*G+G-1 share
  prompt p. The P distinct prompts (minus their last token) are encoded once WITH grad into a
  `DynamicCache`, which is expanded to the G rows; the completions (preceded by the last prompt
  token) run against it. Gradient flows through the shared keys/values into the prompt's LoRA
  weights. The same idea as verl's PrefixGrouper, through the model's own cache API instead of a
  custom attention kernel. Unsupported cases (active gradient checkpointing, which makes HF drop
  the cache; no batch-expandable cache; groups whose prompts differ) fall back to the plain forward
  with a single warning. A group split over several micro-batches can share its prompt across
  them too (`shared_prompt`, prompt_grad.py). With `padding_free` the completions run
  packed into one row of real tokens (padding_free.py): the same result without the
  padding's share of the layers' matrix products. Where the micro-batch holds its groups'
  prompts, they go inline at the start of that row and one forward runs both.
- The shared prompt, the packing and the frozen head are levers (levers.py): each runs only
  where `options.levers` allows it and its admission check (admission.py) passed on the model.
  `options.bf16_products` (train_precision 'bf16'): the body's fused LoRA layers take their
  frozen base products in bf16 (lever `bf16_training`, bf16_products.py).
- MoE router auxiliary loss (`return_aux_loss`): the plain forward runs with
  `output_router_logits=True` and the model's own load-balancing loss (Switch Transformer eqs. 4-6,
  https://arxiv.org/abs/2101.03961) is computed over the real prompt + completion tokens, as the
  model's `ForCausalLM.forward` does; the prefix-shared forward is not used then.
- `pad_to_multiple_of`: the trimmed prompt and completion widths are rounded up to a multiple of it
  (fixed shapes for compilers), never past the widths passed in.

Departures from TRL: log-probs (and entropies) at masked completion positions are 0, not the
model's values there; `temperature <= 0` (greedy sampling) scores with temperature 1. Of the
model's own logit post-processing only Gemma-style `final_logit_softcapping` is reproduced.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from .._compat import (
    cache_argument_name,
    cache_tensors,
    expand_cache,
    gradient_checkpointing_active,
    keep_bnb_4bit_weights_trainable,
    moe_load_balancing_loss,
    output_cache,
    unwrap_peft,
)
from .._logging import warn_once
from ..core.tensors import position_ids_from_mask
from .admission import admit_frozen_head, admit_hidden
from .bf16_products import bf16_products
from .forward_types import CompletionLogprobs, CompletionTokens, ForwardOptions
from .lm_head import chunk_logps, frozen_head_logps, is_frozen_linear
from .padding_free import PackedRows, packed_hidden_with_prompts, packed_suffix_hidden
from .prompt_grad import SharedPromptGrad

__all__ = ["CompletionLogprobs", "CompletionTokens", "ForwardOptions", "completion_logprobs"]


def decoder_body(model: torch.nn.Module) -> torch.nn.Module:
    """The transformer body (embeddings, layers, final norm) without the LM head; works through peft."""
    base = unwrap_peft(model)
    body = base.get_decoder() if hasattr(base, "get_decoder") else None
    if body is None or body is base:
        body = getattr(base, getattr(base, "base_model_prefix", "model"), None)
    if body is None or body is base:
        raise TypeError(
            f"{type(base).__name__} has no separable decoder body (get_decoder()); "
            "completion_logprobs needs a causal LM built as body + lm_head."
        )
    return body


def _round_up(width: int, multiple: int | None, limit: int) -> int:
    if not multiple or width == 0:
        return width
    return min(-(-width // multiple) * multiple, limit)


def _trim_padding(prompt_ids, prompt_mask, completion_ids, completion_mask, multiple=None):
    """Drop all-pad prompt columns on the left and completion columns past the last real token
    (keeping widths that are multiples of `multiple` when it is set)."""
    real_prompt_cols = (prompt_mask.sum(0) > 0).nonzero()
    first = int(real_prompt_cols[0]) if len(real_prompt_cols) else prompt_mask.size(1)
    prompt_width = _round_up(prompt_mask.size(1) - first, multiple, prompt_mask.size(1))
    first = prompt_mask.size(1) - prompt_width
    real_completion_cols = (completion_mask.sum(0) > 0).nonzero()
    width = int(real_completion_cols[-1]) + 1 if len(real_completion_cols) else 0
    width = _round_up(width, multiple, completion_mask.size(1))
    return (
        prompt_ids[:, first:],
        prompt_mask[:, first:],
        completion_ids[:, :width],
        completion_mask[:, :width],
    )


def _plain_hidden(body, prompt_ids, prompt_mask, completion_ids, completion_mask, router=False):
    """Body over prompt + completion; `(N, T, H)` hidden states that predict the completion tokens
    (and the router logits of every MoE layer when `router`)."""
    prompt_len, width = prompt_ids.size(1), completion_ids.size(1)
    mask = torch.cat([prompt_mask, completion_mask], dim=1)  # (N, Lp + T)
    extra = {"output_router_logits": True} if router else {}
    out = body(
        input_ids=torch.cat([prompt_ids, completion_ids], dim=1),
        attention_mask=mask,
        position_ids=position_ids_from_mask(mask),
        use_cache=False,
        **extra,
    )
    hidden = out.last_hidden_state[:, prompt_len - 1 : prompt_len - 1 + width]  # (N, T, H)
    return (hidden, out.router_logits, mask) if router else hidden


def _head_dim(body) -> int:
    """The attention heads' width from the config; 0 where it does not say (then packing is
    decided by the padding it drops alone, `PackedRows.worth_packing`)."""
    config = body.config
    heads, hidden = (getattr(config, k, None) for k in ("num_attention_heads", "hidden_size"))
    return getattr(config, "head_dim", None) or (hidden // heads if heads and hidden else 0)


def _suffix_parts(tensors, group):
    """What both prefix-shared forms need: `(mask (N, Lp + T), positions (N, Lp + T), suffix
    ids (N, T), suffix positions (N, T), the masks a `PackedRows` layout takes)`."""
    prompt_ids, prompt_mask, completion_ids, completion_mask = tensors
    prompt_len, width = prompt_ids.size(1), completion_ids.size(1)
    mask = torch.cat([prompt_mask, completion_mask], dim=1)  # (N, Lp + T)
    positions = position_ids_from_mask(mask)  # (N, Lp + T)
    suffix_ids = torch.cat([prompt_ids[:, -1:], completion_ids[:, :-1]], dim=1)  # (N, T)
    suffix_positions = positions[:, prompt_len - 1 : prompt_len - 1 + width]  # (N, T)
    layout_masks = (prompt_mask[:, :-1], mask[:, prompt_len - 1 : -1], completion_mask, group)
    return mask, positions, suffix_ids, suffix_positions, layout_masks


def _packed_with_prompts(body, group, tensors):
    """Prompts and completions in one packed forward (core of `padding_free`), or None where
    packing would not run (too little padding to drop, or a body that cannot run packed)."""
    _, positions, suffix_ids, suffix_positions, layout_masks = _suffix_parts(tensors, group)
    layout = PackedRows(*layout_masks, prompts_inline=True)
    if not layout.worth_packing(_head_dim(body)):
        return None
    prompt_len = tensors[0].size(1)
    prompts = (tensors[0][::group, :-1], positions[::group, : prompt_len - 1])
    return packed_hidden_with_prompts(body, layout, prompts, suffix_ids, suffix_positions)


def _shared_hidden(body, group, tensors, held, padding_free=False):
    """Prompt prefix encoded once per group, its cache expanded to G rows; None if unsupported.
    `tensors`: the trimmed (prompt_ids, prompt_mask, completion_ids, completion_mask). `held` (a
    `SharedPromptGrad`, or None): a micro-batch that is one part of a larger group runs against
    the group's prompt encoded once, by its first micro-batch. `padding_free`: the completions
    run packed into one row when that drops enough padding (engine/padding_free.py), with the
    prompts inline in the same row and forward unless the prompt is held across micro-batches."""
    prompt_ids, prompt_mask = tensors[0], tensors[1]
    prompt_len = prompt_ids.size(1)
    mask, positions, suffix_ids, suffix_positions, layout_masks = _suffix_parts(tensors, group)
    cache_arg = cache_argument_name(body)

    def encode():
        prefix = body(
            input_ids=prompt_ids[::group, :-1],  # (P, Lp - 1)
            attention_mask=prompt_mask[::group, :-1],
            position_ids=positions[::group, : prompt_len - 1],
            use_cache=True,
            **{cache_arg: None},
        )
        return output_cache(prefix)

    shares_held = held is not None and prompt_ids.size(0) == group  # one prompt, held across
    if padding_free and not shares_held:  # prompts and completions in one packed forward
        hidden = _packed_with_prompts(body, group, tensors)
        if hidden is not None:
            return hidden
    cache, expanded = None, False
    if shares_held:
        cache = held.cache_for(prompt_ids[:1, :-1], prompt_mask[:1, :-1], group, encode)
        expanded = cache is not None
    if cache is None:
        cache = encode()
    if cache is None or cache.get_seq_length() != prompt_len - 1:
        return None
    if padding_free:
        layout = PackedRows(*layout_masks)
        prefix = cache_tensors(cache)  # per layer (keys, values) `(P | N, heads, L, d)`
        if prefix is not None and layout.worth_packing(head_dim=prefix[0][0].size(-1)):
            hidden = packed_suffix_hidden(body, prefix, layout, suffix_ids, suffix_positions)
            if hidden is not None:
                return hidden
    if not expanded and not expand_cache(cache, group):
        return None
    out = body(
        input_ids=suffix_ids,
        attention_mask=mask[:, :-1],  # cached prefix + suffix keys
        position_ids=suffix_positions,
        use_cache=True,
        **{cache_arg: cache},
    )
    return out.last_hidden_state  # (N, T, H)


def _sharing_blocker(model, body, group_size, prompt_ids) -> str | None:
    """Why the prefix-shared forward cannot run here (None when it can)."""
    rows, prompt_len = prompt_ids.shape
    if group_size is None or group_size < 2:
        return "group_size is not set (>= 2)"
    if rows % group_size:
        return f"the batch of {rows} rows is not a multiple of group_size={group_size}"
    if prompt_len < 2:
        return "prompts are a single token"
    grouped = prompt_ids.view(rows // group_size, group_size, prompt_len)
    if not bool((grouped == grouped[:, :1]).all()):
        return "rows of a group do not share their prompt (micro-batch not aligned to groups)"
    if gradient_checkpointing_active(model) and body.training and torch.is_grad_enabled():
        return "gradient checkpointing is active, and HF disables the KV cache under it"
    return None


def _admitted_sharing(body, options: ForwardOptions, tensors) -> tuple[bool, bool]:
    """`(share the prompt, pack the completions)` for this body: each lever on, and admitted by
    its check against the plain forward on the first batch it meets (engine/admission.py)."""
    group, levers = options.group_size, options.levers
    plain = lambda: _plain_hidden(body, *tensors)  # noqa: E731
    real = tensors[3]
    share = admit_hidden(
        "shared_prompt", body, lambda: _shared_hidden(body, group, tensors, None), plain, real
    )
    pack = options.padding_free and levers.padding_free and not options.pad_to_multiple_of
    pack = pack and share
    if pack:
        fast = lambda: _packed_with_prompts(body, group, tensors)  # noqa: E731
        pack = admit_hidden("padding_free", body, fast, plain, real)
    return share, pack


def _completion_hidden(model, tensors, options: ForwardOptions, held):
    body = decoder_body(model)
    if options.share_prompt_prefix and options.levers.shared_prompt:
        blocker = _sharing_blocker(model, body, options.group_size, tensors[0])
        if blocker is None:
            share, pack = _admitted_sharing(body, options, tensors)
            if not share:  # refused by its check (logged): the reference path
                return _plain_hidden(body, *tensors)
            hidden = _shared_hidden(body, options.group_size, tensors, held, pack)
            if hidden is not None:
                return hidden
            blocker = (
                "this model's KV cache cannot be filled with grad and expanded along the batch"
            )
        warn_once(
            "train-share",
            f"share_prompt_prefix: using the plain training forward because {blocker} "
            "(same result, slower).",
        )
    return _plain_hidden(body, *tensors)


def _frozen_head_admitted(head, first_chunk, scoring) -> bool:
    """Lever `frozen_head` on `head`, checked on the first chunk against the checkpointed form."""
    temperature, softcap = scoring
    hidden, targets = first_chunk

    def fast(h):
        return frozen_head_logps(head, h, targets, temperature, softcap, True)

    def reference(h):
        return chunk_logps(head, h, targets, temperature, softcap, "detached")

    return admit_frozen_head(head, fast, reference, hidden)


def _chunked_head(model, hidden, targets, options: ForwardOptions, want_entropy):
    """Run the LM head over `(M, H)` selected positions in chunks; returns `(M,)` logps and entropy."""
    base = unwrap_peft(model)
    head = base.get_output_embeddings()
    softcap = getattr(base.config, "final_logit_softcapping", None)
    temperature, chunk_size = options.temperature, options.chunk_size
    temperature = temperature if temperature > 0 else 1.0
    use_checkpoint = torch.is_grad_enabled() and hidden.requires_grad
    # a frozen head (LoRA, QLoRA): each position's gradient is taken in the forward, no recompute
    frozen = use_checkpoint and want_entropy != "grad" and options.levers.frozen_head
    frozen = frozen and is_frozen_linear(head)
    if frozen and hidden.size(0):
        first = (hidden[:chunk_size], targets[:chunk_size])
        frozen = _frozen_head_admitted(head, first, (temperature, softcap))
    logps, entropies = [], []
    for start in range(0, hidden.size(0), chunk_size):
        chunk = (head, hidden[start : start + chunk_size], targets[start : start + chunk_size])
        if frozen:
            scored = frozen_head_logps(*chunk, temperature, softcap, bool(want_entropy))
        elif use_checkpoint:
            args = (*chunk, temperature, softcap, want_entropy)
            scored = checkpoint(chunk_logps, *args, use_reentrant=False)
        else:
            scored = chunk_logps(*chunk, temperature, softcap, want_entropy)
        logps.append(scored[0])
        entropies.append(scored[1])
    return torch.cat(logps), torch.cat(entropies)


def _check_inputs(tokens: CompletionTokens, chunk_size: int) -> None:
    prompt_ids, prompt_mask, completion_ids, completion_mask = tokens[:4]
    if prompt_ids.shape != prompt_mask.shape or completion_ids.shape != completion_mask.shape:
        raise ValueError(
            "ids and masks must have the same shape: got prompt "
            f"{tuple(prompt_ids.shape)} vs {tuple(prompt_mask.shape)}, completion "
            f"{tuple(completion_ids.shape)} vs {tuple(completion_mask.shape)}."
        )
    if prompt_ids.size(0) != completion_ids.size(0):
        raise ValueError(
            f"prompt rows ({prompt_ids.size(0)}) != completion rows ({completion_ids.size(0)}); "
            "repeat each prompt once per completion (RolloutBatch already does)."
        )
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}.")


def _router_hidden(model, tensors, options: ForwardOptions):
    """The plain forward with the MoE router's logits: `(hidden (N, T, H), aux loss ())`."""
    if options.share_prompt_prefix:
        warn_once(
            "train-share-aux",
            "share_prompt_prefix: using the plain training forward because the MoE router "
            "loss needs every token's router logits (same log-probs, slower).",
        )
    hidden, router_logits, full_mask = _plain_hidden(decoder_body(model), *tensors, router=True)
    return hidden, moe_load_balancing_loss(model, router_logits, full_mask)


def completion_logprobs(
    model: torch.nn.Module,
    tokens: CompletionTokens | tuple,
    options: ForwardOptions | None = None,
    *,
    shared_prompt: SharedPromptGrad | None = None,
    **option_fields: Any,
) -> CompletionLogprobs:
    """Log-probs `(N, Tc)` float32 of each completion token (0 off the scored tokens).

    `tokens`: a `CompletionTokens` (or the tuple of its 4 or 5 tensors). `options`: a
    `ForwardOptions`; `option_fields` set some of its fields instead (`temperature=0.7`).
    Differentiable when grad is enabled. With `share_prompt_prefix` and `group_size`, rows
    p*G .. p*G+G-1 must share prompt p. Returns a `CompletionLogprobs`: `entropy` `(N, Tc)` when
    `return_entropy` (detached unless `entropy_grad`), else None; `aux_loss` (a scalar, the MoE
    router load-balancing loss) when `return_aux_loss`, else None. `shared_prompt` (with
    `share_prompt_prefix`, for a micro-batch of one prompt's rows, part of a larger group): the
    group's prompt is encoded once for all its micro-batches and backpropagated by
    `shared_prompt.after_backward` (engine/prompt_grad.py). Which fast paths run is
    `options.levers` (engine/levers.py), each behind its admission check.
    """
    options = replace(options or ForwardOptions(), **option_fields)
    tokens = CompletionTokens(*tokens)
    _check_inputs(tokens, options.chunk_size)
    prompt_ids, prompt_mask, completion_ids, completion_mask = (
        t.clone() if t.is_inference() else t  # tensors from inference_mode cannot enter autograd
        for t in tokens[:4]
    )
    rows, full_width = completion_ids.shape
    tensors = _trim_padding(
        prompt_ids, prompt_mask, completion_ids, completion_mask, options.pad_to_multiple_of
    )
    width = tensors[2].size(1)
    logps = torch.zeros(rows, full_width, dtype=torch.float32, device=completion_ids.device)
    entropy = torch.zeros_like(logps) if options.return_entropy else None
    aux_loss = logps.new_zeros(()) if options.return_aux_loss else None
    if width == 0 or tensors[0].size(1) == 0:
        return CompletionLogprobs(logps, entropy, aux_loss)

    keep_bnb_4bit_weights_trainable(model)
    with bf16_products(options.bf16_products and options.levers.bf16_training):
        if options.return_aux_loss:
            hidden, aux_loss = _router_hidden(model, tensors, options)
        else:
            hidden = _completion_hidden(model, tensors, options, shared_prompt)
    score_mask = tokens.score_mask
    real = tensors[3] if score_mask is None else score_mask[:, :width] * tensors[3]  # (N, T)
    real = real.bool()
    entropy_mode = ""
    if options.return_entropy:
        entropy_mode = "grad" if options.entropy_grad else "detached"
    selected_logps, selected_entropy = _chunked_head(
        model,
        hidden[real],
        tensors[2][real],
        options,
        entropy_mode,  # (M, H), (M,)
    )
    padded_real = torch.nn.functional.pad(real, (0, full_width - width))  # (N, Tc)
    logps = logps.masked_scatter(padded_real, selected_logps)
    if options.return_entropy:
        if not options.entropy_grad:
            selected_entropy = selected_entropy.detach()
        entropy = entropy.masked_scatter(padded_real, selected_entropy)
    return CompletionLogprobs(logps, entropy, aux_loss)
