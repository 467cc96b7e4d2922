"""peft 0.21's LoRA linear forward in one matrix product per adapter (see the table in
`_compat/__init__.py`).

peft computes `base(x) + lora_B(lora_A(x)) * scaling`: after the base product, one pass over the
`(tokens, out)` output to scale it, one to add it, and their backward passes. `Tensor.addmm_` does
the up-projection, the scaling and the sum in one product that accumulates into the base output:
`y = x W^T + s (x A^T) B^T` (LoRA, https://arxiv.org/abs/2106.09685). Same log-probs bit for bit on
SmolLM2 + LoRA r=16 (16 x 24 tokens), gradients within 2e-6 relative (float summation order). In
the trainer with policy rollouts (`short`'s settings, switched at alternate steps; 2-core Xeon,
2026-12-06) about 6% of a step, generation and training both; with a merged bf16 rollout copy
no measurable gain (docs/benchmarks.md, round three 2026-12-06). The product accumulates in
place into the base output, which autograd does not keep (frozen W): an out-of-place `addmm`
copied that output first, one more pass per layer (forward + backward of `short`'s training
micro-batch: 1.143 -> 1.118 s, log-probs and gradients equal bit for bit).

Any case but the plain one runs peft's own forward, decided at each call: extra arguments (mixed
adapter batches), adapters disabled or merged, a LoRA variant (DoRA, ...), dropout, a bias on B,
an input of another dtype than the weights (peft casts it), hooks on the layers it would bypass,
distributed (DTensor) weights, a base layer that is not a plain `nn.Linear` (4-bit, ...).
"""

from __future__ import annotations

import types
from typing import Any

import torch

__all__ = ["LORA_INIT_OPTIONS", "fuse_lora_linears", "lora_init_known", "lora_variant_fields"]

# peft 0.21's `init_lora_weights` strings (besides True/False); "pissa_niter_N" too. peft checks
# them only when it builds the adapter, after the model has loaded.
LORA_INIT_OPTIONS = ("gaussian", "eva", "olora", "pissa", "corda", "loftq", "orthogonal", "mica")


def lora_init_known(value: Any) -> bool:
    """Whether peft 0.21 knows the `init_lora_weights` string `value`."""
    if not isinstance(value, str):
        return False
    niter = value.removeprefix("pissa_niter_")
    return value in LORA_INIT_OPTIONS or (niter != value and niter.isdigit())


def lora_variant_fields(config: Any) -> list[str]:
    """The fields of a peft `LoraConfig` that select a LoRA variant (DoRA, aLoRA, MiCA, ...),
    as peft 0.21 reads them: a field whose metadata says `is_lora_variant` and whose value is
    truthy, or `init_lora_weights` set to one of the variants its metadata lists. [] for a plain
    LoRA (or no config)."""
    import dataclasses

    if config is None or not dataclasses.is_dataclass(config):
        return []
    found = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name, None)
        if f.metadata.get("is_lora_variant") and value:
            found.append(f.name)
        elif f.name == "init_lora_weights" and value in f.metadata.get("lora_variants", ()):
            found.append(f"init_lora_weights={value!r}")
    return found


def fuse_lora_linears(model: torch.nn.Module) -> int:
    """Give every peft LoRA `Linear` of `model` the one-product forward; returns how many."""
    try:
        from peft.tuners.lora.layer import Linear as LoraLinear
    except ImportError:
        return 0
    count = 0
    for module in model.modules():
        if type(module) is LoraLinear and "forward" not in vars(module):
            module.forward = types.MethodType(_one_product_forward, module)
            count += 1
    return count


def _one_product_forward(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """`(..., in)` -> `(..., out)`: peft's LoRA forward, in one `addmm` per active adapter."""
    adapters = None if args or kwargs else _plain_adapters(self, x)
    if adapters is None:
        return type(self).forward(self, x, *args, **kwargs)
    base = self.base_layer
    flat = x.reshape(-1, x.shape[-1])  # (tokens, in)
    out = torch.nn.functional.linear(flat, base.weight, base.bias)  # (tokens, out)
    for down, up, scale in adapters:  # (r, in), (out, r)
        out.addmm_(flat @ down.t(), up.t(), alpha=scale)  # += s (x A^T) B^T, in place
    return out.view(*x.shape[:-1], out.shape[-1])


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
