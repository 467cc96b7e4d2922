"""The `cache_tensors`, `dynamic_cache_of` row of the table in `_compat/__init__.py`: a
`DynamicCache`'s per-layer keys and values in and out (the shared prompt's cache in
`engine/forward.py`, `padding_free.py` and `prompt_grad.py`)."""

from __future__ import annotations

import torch

__all__ = ["cache_tensors", "dynamic_cache_of"]


def cache_tensors(cache) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """Each layer's (keys, values) of a `DynamicCache` of plain `DynamicLayer`s; None otherwise."""
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer).__name__ != "DynamicLayer" for layer in layers):
        return None
    return [(layer.keys, layer.values) for layer in layers]


def dynamic_cache_of(tensors: list[tuple[torch.Tensor, torch.Tensor]]):
    """A `DynamicCache` holding these per-layer (keys, values); the next update appends columns."""
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=tensors)
