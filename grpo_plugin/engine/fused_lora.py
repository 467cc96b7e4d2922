"""peft 0.21's LoRA linear forward in one matrix product per adapter (lever `fused_lora`; remove
when peft fuses the adapter product into the base output).

peft computes `base(x) + lora_B(lora_A(x)) * scaling`: after the base product, one pass over the
`(tokens, out)` output to scale it, one to add it, and their backward passes. `Tensor.addmm_` does
the up-projection, the scaling and the sum in one product that accumulates into the base output:
`y = x W^T + s (x A^T) B^T` (LoRA, https://arxiv.org/abs/2106.09685). Same log-probs bit for bit on
SmolLM2 + LoRA r=16 (16 x 24 tokens), gradients within 2e-6 relative (float summation order). Its gain in the
trainer: docs/benchmarks.md ("The engine's levers"). The product accumulates in
place into the base output, which autograd does not keep (frozen W): an out-of-place `addmm`
copied that output first, one more pass per layer (log-probs and gradients equal bit for bit).

Any case but the plain one runs peft's own forward, decided at each call: extra arguments (mixed
adapter batches), adapters disabled or merged, a LoRA variant (DoRA, ...), dropout, a bias on B,
an input of another dtype than the weights (peft casts it), hooks on the layers it would bypass,
distributed (DTensor) weights, a base layer that is not a plain `nn.Linear` (4-bit, ...). One
exception: under bf16 products (`train_precision: bf16`, bf16_products.py) a layer with its
adapters disabled (a LoRA policy's reference) runs its base product alone, in bf16 as the policy's.

Admission (`fuse_lora_linears`): before any layer is fused, each plain layer's fused forward is
run against peft's own on random input with its B set to random values (a fresh adapter's B is
zero and would hide a difference); one layer off by more than 1e-5 (relative) and none is fused.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from .bf16_products import base_product
from .levers import admitted, relative_difference

__all__ = ["fuse_lora_linears", "fused_layers"]


def fuse_lora_linears(model: torch.nn.Module) -> int:
    """Give every peft LoRA `Linear` of `model` the one-product forward, once the admission
    check passes on every one of them (`_admission_difference`); returns how many."""
    try:
        from peft.tuners.lora.layer import Linear as LoraLinear
    except ImportError:
        return 0
    layers = [m for m in model.modules() if type(m) is LoraLinear and "forward" not in vars(m)]
    if not layers:
        return 0
    difference = max(_admission_difference(layer) for layer in layers)
    if not admitted("fused_lora", model, difference):
        return 0
    for layer in layers:
        layer.forward = types.MethodType(_one_product_forward, layer)
    return len(layers)


def fused_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The LoRA layers of `model` that took the one-product forward."""
    return [
        m for m in model.modules() if getattr(m.forward, "__func__", None) is _one_product_forward
    ]


@torch.no_grad()
def _admission_difference(layer: Any) -> float:
    """The fused forward against peft's own on 3 random rows, with each active adapter's B set
    to random values for the check (a fresh adapter's B is 0, which would hide any difference in
    the adapter's term) and put back bit for bit. Draws from a generator of its own, never the
    global one. 0.0 where the layer is not in the plain case: peft's forward runs there anyway."""
    weight = layer.base_layer.weight
    if weight.device.type == "meta":
        return 0.0
    generator = torch.Generator(device=weight.device).manual_seed(0)
    x = torch.randn(3, weight.shape[1], generator=generator, device=weight.device)
    x = x.to(weight.dtype)
    adapters = _plain_adapters(layer, x)
    if not adapters:
        return 0.0
    saved = [up.clone() for _, up, _ in adapters]
    try:
        for _, up, _ in adapters:
            up.copy_(torch.randn(up.shape, generator=generator, device=up.device).to(up.dtype))
        fast = _one_product_forward(layer, x)
        reference = type(layer).forward(layer, x)
    finally:
        for (_, up, _), value in zip(adapters, saved):
            up.copy_(value)
    return relative_difference(fast, reference)


def _one_product_forward(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """`(..., in)` -> `(..., out)`: peft's LoRA forward, in one `addmm` per active adapter."""
    adapters = None if args or kwargs else _plain_adapters(self, x)
    if adapters is None:
        off = None if args or kwargs else _adapters_off_product(self, x)
        return type(self).forward(self, x, *args, **kwargs) if off is None else off
    base = self.base_layer
    flat = x.reshape(-1, x.shape[-1])  # (tokens, in)
    out = base_product(self, base, flat)  # in bf16 under lever `bf16_training`, else None
    if out is None:
        out = torch.nn.functional.linear(flat, base.weight, base.bias)  # (tokens, out)
    for down, up, scale in adapters:  # (r, in), (out, r)
        out.addmm_(flat @ down.t(), up.t(), alpha=scale)  # += s (x A^T) B^T, in place
    return out.view(*x.shape[:-1], out.shape[-1])


def _adapters_off_product(self: Any, x: torch.Tensor) -> torch.Tensor | None:
    """`(..., in)` -> `(..., out)`: peft's forward with the adapters disabled (the reference of a
    LoRA policy), `base(x)`, where the base product runs in bf16 (bf16_products.py), so that the
    policy and its reference share their products; else None."""
    base = self.base_layer
    if not self.disable_adapters or self.merged or type(base) is not torch.nn.Linear:
        return None
    if not (_plain(base) and _local(base.weight, base.bias)):
        return None
    out = base_product(self, base, x.reshape(-1, x.shape[-1]))  # (tokens, out) or None
    return None if out is None else out.view(*x.shape[:-1], out.shape[-1])


def _plain(module: torch.nn.Module) -> bool:
    """A module the fast path may bypass: no hooks of its own."""
    return not (module._forward_hooks or module._forward_pre_hooks or module._backward_hooks)


def _local(*tensors: torch.Tensor | None) -> bool:
    return all(t is None or type(t.data) is torch.Tensor for t in tensors)


def _plain_adapters(self: Any, x: torch.Tensor) -> list[tuple] | None:
    """`(A, B, scaling)` of each active adapter when the layer is in the plain case, else None."""
    base = self.base_layer
    if self.disable_adapters or self.merged or getattr(self, "lora_variant", None):
        return None
    if type(base) is not torch.nn.Linear or not _plain(base) or getattr(self, "fan_in_fan_out", 0):
        return None
    if torch.is_autocast_enabled(x.device.type) or not _local(base.weight, base.bias):
        return None
    found = []
    for name in self.active_adapters:
        if name not in self.lora_A:
            continue  # peft skips it too
        down, up = self.lora_A[name], self.lora_B[name]
        if type(self.lora_dropout[name]) is not torch.nn.Identity or up.bias is not None:
            return None
        if not (_plain(down) and _plain(up) and _local(down.weight, up.weight)):
            return None
        if not (x.dtype == base.weight.dtype == down.weight.dtype == up.weight.dtype):
            return None
        found.append((down.weight, up.weight, self.scaling[name]))
    return found
