"""The decode step: one forward of the policy that returns the last position's float32 logits
and updates the KV cache, `(ids, mask, positions, cache) -> (logits (A, V), cache)`.

Two forms, one interface, used by the decode loops of `rollout/`:
- `Decoder`: the dynamic cache, every step (prefill or one token) through transformers'
  forward;
- `StaticDecoder`: a preallocated `StaticCache` at fixed shapes, eager or compiled with
  `torch.compile` (CUDA graphs on a GPU: `mode="reduce-overhead"`). It compiles once per shape
  (rows, cache width) and model; the loop (`rollout/static_decode.py`) keeps both fixed.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from .._compat import (
    accepts_logits_to_keep,
    cache_argument_name,
    last_position_to_keep,
    output_cache,
    unwrap_peft,
)
from .._logging import warn_once

__all__ = ["Decoder", "StaticDecoder"]

logger = logging.getLogger(__name__)


class Decoder:
    """Runs the causal LM forward with an explicit cache and returns last-position float32
    logits."""

    def __init__(self, model: torch.nn.Module):
        self.model = unwrap_peft(model)
        self.cache_arg = cache_argument_name(self.model)
        self.keeps_last_only = accepts_logits_to_keep(self.model)

    def __call__(self, input_ids, attention_mask, position_ids, cache=None):
        kwargs = {self.cache_arg: cache, "use_cache": True}
        if self.keeps_last_only:
            kwargs["logits_to_keep"] = last_position_to_keep(input_ids.size(1))
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs
        )
        return out.logits[:, -1, :].float(), output_cache(out)  # (B, V)


_COMPILED: dict[str, Any] = {}  # torch.compile mode -> the compiled `_decode_step`
_SHAPES_SEEN: set[tuple] = set()  # (model id, rows, width, mode) already compiled


def _decode_step(model, ids, mask, positions, options: dict[str, Any]):
    """One forward of `ids` `(A, 1)` at `positions` `(A, 1)` over `mask` `(A, W)` (`options`:
    the cache under the model's argument name, `use_cache`, `logits_to_keep`): the last
    position's float32 logits `(A, V)`. The cache is updated in place."""
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, **options)
    return out.logits[:, -1, :].float()


def _compiled(mode: str):
    if mode not in _COMPILED:
        options = {} if mode == "default" else {"mode": mode}
        _COMPILED[mode] = torch.compile(_decode_step, dynamic=False, **options)
    return _COMPILED[mode]


class StaticDecoder:
    """The model's decode step at fixed shapes, eager or compiled: `(ids, mask, positions,
    cache) -> (logits (A, V), cache)`, the same interface as `Decoder`."""

    def __init__(self, model: torch.nn.Module, compile: bool, width: int) -> None:
        self.model = unwrap_peft(model)
        self.width = width  # the static cache's columns
        self.cache_arg = cache_argument_name(self.model)
        self.last_only = accepts_logits_to_keep(self.model)
        self.device = next(self.model.parameters()).device
        self.mode = (
            ("reduce-overhead" if self.device.type == "cuda" else "default") if compile else ""
        )
        self.step = _compiled(self.mode) if compile else _decode_step
        self._compiling: tuple | None = None  # the shape whose first step compiles, and when
        if compile and self.device.type == "cpu":
            warn_once(
                "compile-cpu",
                "compile_decode on a CPU: measured slower or barely faster than the eager loop "
                "(docs/benchmarks.md); it is meant for GPUs (CUDA graphs).",
            )

    def announce(self, rows: int) -> None:
        """Log, once per shape, that the next step compiles; its cost is logged after it."""
        key = (id(self.model), rows, self.width, self.mode)
        if self.mode and key not in _SHAPES_SEEN:
            _SHAPES_SEEN.add(key)
            self._compiling = (rows, time.perf_counter())
            logger.info(
                "compile_decode: compiling the decode step for %d rows x %d cache columns "
                "(once per shape; it takes a while on a CPU)",
                rows,
                self.width,
            )

    def __call__(self, ids, mask, positions, cache):
        options = {self.cache_arg: cache, "use_cache": True}
        if self.last_only:
            options["logits_to_keep"] = 1
        logits = self.step(self.model, ids, mask, positions, options)
        if self._compiling is not None:
            rows, start = self._compiling
            self._compiling = None
            logger.info(
                "compile_decode: the first step at %d rows x %d columns took %.1f s (compilation "
                "included; later steps of this shape replay it)",
                rows,
                self.width,
                time.perf_counter() - start,
            )
        # CUDA graphs reuse their output buffer at the next replay: keep our own logits
        return (logits.clone() if self.mode == "reduce-overhead" else logits), cache
