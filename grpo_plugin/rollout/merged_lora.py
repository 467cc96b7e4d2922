"""Decode on merged LoRA weights: each adapted linear layer runs one matmul instead of three.

A LoRA layer computes `W x + s * B (A x)` (LoRA eq. 3, [arXiv:2106.09685](https://arxiv.org/abs/2106.09685)).
While a rollout decodes, `merged_lora_weights` swaps in `W' = W + s * B A` as a new tensor per
layer and turns the adapter branch off, so each decode step reads one weight per layer. It
differs from peft's `merge_adapter` in that the frozen base is never written: the original
`W` objects are put back on exit, bit for bit (peft's merge then unmerge adds and subtracts
`s * B A` in place, which rounds `W` a little each rollout). Cost: one copy of the adapted
weights for the length of the rollout (about 430 MB for the fp32 135M demo model).

Sampling from `W'` is the same distribution up to float rounding (`W' x` and `W x + s B A x`
differ in the last bits); the training forward scores the tokens with the unmerged adapter, as
it always has, so the loss is unchanged. The merge applies only where it is plain: every adapted
module is an `nn.Linear` LoRA layer with one active adapter, no DoRA and no quantized base;
anything else decodes through the adapter as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch


def _mergeable_layers(model: torch.nn.Module) -> list[torch.nn.Module] | None:
    """The LoRA linear layers to merge, or None when any adapted module is not plain."""
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

    if not isinstance(model, PeftModel) or len(model.active_adapters) != 1:
        return None
    adapter = model.active_adapters[0]
    layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    for layer in layers:
        base = layer.get_base_layer()
        if type(base) is not torch.nn.Linear or adapter not in layer.lora_A:
            return None  # embeddings, convs, 4-bit / 8-bit bases
        if layer.use_dora.get(adapter, False) or layer.merged:
            return None
    return layers or None


@contextmanager
def merged_lora_weights(model: torch.nn.Module) -> Iterator[bool]:
    """Within the block, `model` decodes on `W + s*BA` with its adapter branch off; yields
    whether the merge applied. The original weight Parameters are restored on exit."""
    layers = _mergeable_layers(model)
    if layers is None:
        yield False
        return
    adapter = model.active_adapters[0]
    originals = []
    try:
        with torch.no_grad():
            for layer in layers:
                base = layer.get_base_layer()
                delta = layer.get_delta_weight(adapter).to(base.weight.dtype)  # (out, in)
                originals.append((base, base.weight))
                base._parameters["weight"] = torch.nn.Parameter(
                    base.weight + delta, requires_grad=False
                )
        with model.disable_adapter():
            yield True
    finally:
        for base, weight in originals:
            base._parameters["weight"] = weight


def maybe_merged(model: torch.nn.Module, enabled: bool):
    """`merged_lora_weights(model)` when `enabled`, else a no-op context."""
    return merged_lora_weights(model) if enabled else nullcontext(False)
