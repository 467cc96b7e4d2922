"""bf16 products in the training forward and backward, float32 master weights (lever
`bf16_training`, `train_precision: bf16`; asked for, never the default).

With LoRA the base weights are frozen, and most of a training step's FLOPs are the products of
the activations with them: `y = x W^T` forward, `dx = dy W` backward, in float32. On a CPU with
AVX512-BF16 or AMX a bf16 product runs several times faster (docs/benchmarks.md, "Each phase
against what the CPU can do"). Here each fused LoRA layer (fused_lora.py) takes its base product
from a bfloat16 copy of its frozen weight, cast once and kept (cast again only if the weight is
written, e.g. by a resume's load). Its input is rounded to bfloat16, and the product (summed in
float32 by oneDNN, rounded to bf16 on output: torch 2.13 has no bf16 x bf16 -> float32 product on
a CPU) comes back as float32. The backward's `dy W` runs the same way. A layer with its adapters
disabled (a LoRA policy's reference) takes the same product, so a KL starts at exactly 0.

Everything else stays float32: the adapters A and B and their gradients, the optimizer's state,
norms, attention, the LM head and the log-softmax. This is mixed-precision training with float32
master weights (Micikevicius et al., https://arxiv.org/abs/1710.03740), restricted to the frozen
products.

It runs only inside `bf16_products(True)`, which the engine enters for the trainer's training
forwards, never for evaluation or rollouts. It runs only on layers its admission check passed
(`admit_layers`: every layer's bf16 product against its float32 one, on random input, within the
lever's tolerance, engine/levers.py). The training forward's other admission checks
(admission.py) compare float32 forms, so they run with the products off.

Why it is not the default: rounding to bf16 turns float32's summation-order differences (another
micro-batch split, another number of processes) into differences of 2^-9 in some elements. The
result then depends on the layout (docs/configuration.md, "bf16 products in training").
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from .levers import admitted, relative_difference

__all__ = ["admit_layers", "base_product", "bf16_products", "products_on"]

_ON: ContextVar[bool] = ContextVar("grpo_plugin_bf16_products", default=False)
_ADMITTED: weakref.WeakSet = weakref.WeakSet()  # layers whose check passed
_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # layer -> (key, bf16 weight)


@contextmanager
def bf16_products(on: bool) -> Iterator[None]:
    """Admitted layers take their frozen product in bf16 inside this context when `on`; off
    inside it when not (the admission checks of the other levers)."""
    token = _ON.set(on)
    try:
        yield
    finally:
        _ON.reset(token)


def products_on() -> bool:
    """Whether the current context asks for bf16 products."""
    return _ON.get()


class _FrozenBf16Product(torch.autograd.Function):
    """`(tokens, in)` float32 -> `(tokens, out)` float32: `x W^T` with x and W in bf16 (W frozen:
    no gradient for it); backward `dx = dy W` in bf16, returned in float32."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(weight)
        return torch.nn.functional.linear(x.to(torch.bfloat16), weight).float()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (weight,) = ctx.saved_tensors
        return (grad.to(torch.bfloat16) @ weight).float(), None


def _bf16_weight(layer: torch.nn.Module, weight: torch.Tensor) -> torch.Tensor:
    """The bf16 copy of `layer`'s frozen `weight` `(out, in)`, cast again when it was written."""
    key = (weight.data_ptr(), weight._version)
    found = _COPIES.get(layer)
    if found is None or found[0] != key:
        found = (key, weight.detach().to(torch.bfloat16).contiguous())
        _COPIES[layer] = found
    return found[1]


def base_product(layer: torch.nn.Module, base: torch.nn.Linear, x: torch.Tensor):
    """`(tokens, in)` -> `(tokens, out)` float32: `base(x)` in bf16 where this layer may (the
    context on, its check passed, a frozen float32 weight); None where it runs float32."""
    weight = base.weight
    if not (_ON.get() and layer in _ADMITTED) or weight.requires_grad:
        return None
    if weight.dtype != torch.float32 or x.dtype != torch.float32:
        return None
    out = _FrozenBf16Product.apply(x, _bf16_weight(layer, weight))
    return out if base.bias is None else out.add_(base.bias)


@torch.no_grad()
def _difference(layer: torch.nn.Module, base: torch.nn.Linear) -> float:
    """One layer's bf16 product against its float32 one, on 3 random rows (a generator of its
    own, never the global one)."""
    weight = base.weight
    generator = torch.Generator(device=weight.device).manual_seed(0)
    x = torch.randn(3, weight.shape[1], generator=generator, device=weight.device)
    fast = _FrozenBf16Product.apply(x, weight.detach().to(torch.bfloat16))
    return relative_difference(fast, torch.nn.functional.linear(x, weight))


def _eligible(layer: torch.nn.Module) -> bool:
    """A fused layer whose plain forward will run (no dropout, no variant) over a frozen float32
    CPU weight."""
    base = layer.base_layer
    if type(base) is not torch.nn.Linear or getattr(layer, "lora_variant", None):
        return False
    if any(type(d) is not torch.nn.Identity for d in layer.lora_dropout.values()):
        return False
    weight = base.weight
    return weight.dtype == torch.float32 and not weight.requires_grad and weight.is_cpu


def admit_layers(owner: torch.nn.Module, layers: Iterable[torch.nn.Module]) -> int:
    """Lever `bf16_training` on `owner`'s fused LoRA `layers`: admitted when every frozen
    float32 base product is within the lever's tolerance in bf16; returns how many layers take
    it (0 when refused, logged by `admitted`)."""
    eligible = [layer for layer in layers if _eligible(layer)]
    if not eligible:
        return 0
    difference = max(_difference(layer, layer.base_layer) for layer in eligible)
    if not admitted("bf16_training", owner, difference):
        return 0
    _ADMITTED.update(eligible)
    return len(eligible)
