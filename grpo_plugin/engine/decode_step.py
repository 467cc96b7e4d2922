"""One decode step of a Llama-family model without transformers' per-step machinery (lever
`lean_decode`; remove when transformers' decode step costs little beyond its operations, as a
compiled or graph-captured step does).

A decode step through `model(...)` runs transformers' mask builder, its output-capturing and
config-defaulting decorators, the Hub-kernel and checkpointing wrappers of every layer and the
module dispatch of each norm, attention and MLP, for one token per row. On SmolLM2-135M's packed
bf16 rollout copy (16 rows, 46 cached positions; 2-core Xeon, 2026-12-06) that step took 30.9 ms,
of which the weight products are about 20. `LeanDecodeStep` runs the same operations in the same
order on the same modules: the embedding; per layer the RMSNorm, the q/k/v projections, the rotary
embedding, the cache's own `update`, attention through transformers' registered SDPA entry with
the mask transformers builds for one new token (none without padding, else the padding mask),
o_proj and the residual, the RMSNorm, the SiLU-gated MLP and the residual; the final norm and the
LM head on the last position. 25.5 ms.

It is used only where it mirrors the model exactly: the classes below (Llama, and Qwen2 without
sliding-window layers), SDPA attention, SiLU, a cache of plain dynamic layers, no hooks on the
modules whose forward it replaces, no live dropout. And it proves it on the model itself: the
first step with each model runs both forms and keeps the lean one only if its logits equal
transformers' bit for bit (else, once, a log line and transformers' forward from then on).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from .._compat import cache_tensors
from .levers import admitted, relative_difference, verdict

__all__ = ["LeanDecodeStep"]

logger = logging.getLogger(__name__)

# ForCausalLM class -> (its module, the classes whose forward the lean step replaces).
_MIRRORED = {
    "LlamaForCausalLM": ("transformers.models.llama.modeling_llama", "Llama"),
    "Qwen2ForCausalLM": ("transformers.models.qwen2.modeling_qwen2", "Qwen2"),
}
_LAYER_PARTS = ("DecoderLayer", "Attention", "MLP", "RMSNorm", "RMSNorm")  # as `_mirrors` lists


def _is(module: torch.nn.Module, home: str, name: str) -> bool:
    cls = type(module)
    return cls.__module__ == home and cls.__name__ == name


def _hooked(module: torch.nn.Module) -> bool:
    """Hooks, or a forward set on the instance (accelerate's autocast wrapper under mixed
    precision, an offloading hook): the lean step would run without them."""
    hooks = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks")
    patched = "forward" in vars(module) or "_hf_hook" in vars(module)
    return patched or any(getattr(module, h, None) for h in hooks)


def _drops_out(model: torch.nn.Module) -> bool:
    """Dropout live anywhere (a LoRA dropout in train mode): the two forms of the first step
    would draw different masks, and the check would consume random numbers."""
    dropouts = (m for m in model.modules() if isinstance(m, torch.nn.modules.dropout._DropoutNd))
    attention = getattr(model.config, "attention_dropout", 0.0) and model.training
    return bool(attention) or any(m.training and m.p > 0 for m in dropouts)


def _mirrors(model: torch.nn.Module) -> bool:
    """Whether the lean step computes exactly what `model`'s forward computes (by structure)."""
    home, prefix = _MIRRORED.get(type(model).__name__, (None, None))
    body, config = getattr(model, "model", None), getattr(model, "config", None)
    if home is None or type(model).__module__ != home or body is None or config is None:
        return False
    if torch.nn.modules.module._global_forward_hooks or any(
        getattr(torch.nn.modules.module, name, None)
        for name in ("_global_forward_pre_hooks", "_global_backward_hooks")
    ):
        return False
    layers = list(body.layers[: config.num_hidden_layers])
    bypassed = [model, body, body.norm]
    for layer in layers:
        bypassed += [layer, layer.self_attn, layer.mlp]
        bypassed += [layer.input_layernorm, layer.post_attention_layernorm]
    expected = [type(model).__name__, prefix + "Model", prefix + "RMSNorm"]
    expected += [prefix + part for part in _LAYER_PARTS] * len(layers)
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    return (
        all(_is(m, home, name) for m, name in zip(bypassed, expected, strict=True))
        and not any(_hooked(m) for m in bypassed)
        and not _drops_out(model)
        and all(getattr(layer.self_attn, "sliding_window", None) is None for layer in layers)
        and kinds == {"full_attention"}
        and getattr(config, "_attn_implementation", None) == "sdpa"
        and getattr(config, "hidden_act", None) == "silu"
        and getattr(config, "pretraining_tp", 1) == 1
    )


def _rms_norm(norm: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """transformers' Llama RMSNorm, value for value: float32 statistics, the weight in x's dtype.
    In place where transformers allocates (the same roundings; `x * x` is `pow(2)`'s kernel),
    but never on `x` itself (a float32 `x` is its own `to(float32)`)."""
    hidden = x.to(torch.float32)
    variance = (hidden * hidden).mean(-1, keepdim=True)
    scale = variance.add_(norm.variance_epsilon).rsqrt_()  # (..., 1)
    hidden = hidden * scale if hidden is x else hidden.mul_(scale)
    return norm.weight * hidden.to(x.dtype)


def _signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """`sin` with its first half negated, so that `_rotate` needs no negation per layer."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of `(A, heads, 1, d)`, as transformers' `apply_rotary_pos_emb`:
    `x cos + rotate_half(x) sin` with `rotate_half(x) = (-x2, x1)`. Here `(x2, x1)` is one roll
    and the sign sits in `signed_sin`: `x2 * -s1` and `-x2 * s1` are the same float."""
    return (x * cos) + (x.roll(x.shape[-1] // 2, -1) * signed_sin)


class LeanDecodeStep:
    """`step(ids (A, 1), attention (A, W), positions (A, 1), cache, reference)` -> last-position
    float32 logits `(A, V)`, appending one column to `cache`. `reference(ids, attention,
    positions, cache)` is transformers' forward returning the same; it runs on the first step
    with each model (and its result is what that step returns), then only where the lean step
    was not bit-exact."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    @staticmethod
    def of(model: torch.nn.Module) -> LeanDecodeStep | None:
        """The lean step for `model` (a transformers ForCausalLM, peft unwrapped), or None where
        it does not mirror the model or was found not bit-exact on it."""
        if verdict("lean_decode", model) is False or not _mirrors(model):
            return None
        return LeanDecodeStep(model)

    def takes(self, ids: torch.Tensor, cache) -> bool:
        """One token per row, on a cache of plain dynamic layers (`_compat.cache_tensors`)."""
        return ids.size(1) == 1 and cache_tensors(cache) is not None

    def __call__(self, ids, attention, positions, cache, reference: Callable) -> torch.Tensor:
        known = verdict("lean_decode", self.model)
        if known:
            return self._forward(ids, attention, positions, cache)
        if known is False:
            return reference(ids, attention, positions, cache)
        held = [(layer.keys, layer.values) for layer in cache.layers]  # (A, kv heads, W, d) each
        try:
            lean = self._forward(ids, attention, positions, cache)
        except Exception as error:  # noqa: BLE001 (whatever it is, transformers' forward decodes)
            lean = error
        for layer, (keys, values) in zip(cache.layers, held, strict=True):
            layer.keys, layer.values = keys, values  # the step's column comes from the reference
        logits = reference(ids, attention, positions, cache)
        if isinstance(lean, Exception):
            logger.info("lean_decode: the lean step raised %r on this model", lean)
        difference = relative_difference(lean, logits) if isinstance(lean, torch.Tensor) else 1e30
        admitted("lean_decode", self.model, difference)
        return logits

    def _forward(self, ids, attention, positions, cache) -> torch.Tensor:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        body = self.model.model
        attend = ALL_ATTENTION_FUNCTIONS["sdpa"]
        x = body.embed_tokens(ids)  # (A, 1, H)
        cos, sin = body.rotary_emb(x, position_ids=positions)  # (A, 1, d) each
        cos, sin = cos.unsqueeze(1), _signed_sin(sin.unsqueeze(1))
        # transformers' mask for one new token: none when no row is padded, else the padding mask
        mask = None if bool(attention.all()) else attention.bool()[:, None, None, :]  # (A,1,1,W)
        for index, layer in enumerate(body.layers[: body.config.num_hidden_layers]):
            attn = layer.self_attn
            hidden = _rms_norm(layer.input_layernorm, x)
            shape = (*hidden.shape[:-1], -1, attn.head_dim)
            query = _rotate(attn.q_proj(hidden).view(shape).transpose(1, 2), cos, sin)
            key = _rotate(attn.k_proj(hidden).view(shape).transpose(1, 2), cos, sin)
            value = attn.v_proj(hidden).view(shape).transpose(1, 2)  # (A, kv heads, 1, d)
            key, value = cache.update(key, value, index)  # (A, kv heads, W, d)
            dropout = attn.attention_dropout if attn.training else 0.0
            out, _ = attend(attn, query, key, value, mask, dropout=dropout, scaling=attn.scaling)
            x = x + attn.o_proj(out.reshape(*hidden.shape[:-1], -1).contiguous())
            hidden = _rms_norm(layer.post_attention_layernorm, x)
            mlp = layer.mlp
            x = x + mlp.down_proj(mlp.act_fn(mlp.gate_proj(hidden)) * mlp.up_proj(hidden))
        x = _rms_norm(body.norm, x)
        return self.model.lm_head(x[:, -1:, :])[:, -1, :].float()  # (A, V)
