"""The decode step, and how it runs: one forward of the policy that returns the last position's
float32 logits and updates the KV cache, `(ids, mask, positions, cache) -> (logits (A, V), cache)`.

The rollout's loops (`rollout/generation.py`, `rollout/static_decode.py`) choose the tokens; every
forward they need, and every change to the KV cache, goes through a decoder here:

- `Decoder`: the dynamic cache. `prefill` encodes the prompts, each distinct prompt ONCE with its
  KV cache expanded to its G rows (lever `shared_prefill`, admitted once per model: its logits
  against every row prefilled); `__call__` is one step; `keep_rows` drops finished rows.
- `StaticDecoder`: a preallocated `StaticCache` at fixed shapes, eager (lever `static_decode`) or
  compiled with `torch.compile` (lever `compiled_decode`; CUDA graphs on a GPU:
  `mode="reduce-overhead"`). `Decoder.static` builds one from a prefilled dynamic cache and admits
  it once per model: its first step's logits against the dynamic step's. It compiles once per
  shape (rows, cache width) and model; the loop keeps both fixed.

`DecodeSettings` is what the engine chose for a run (`plan.decode_settings`): the user asks
(`cache_implementation`, `compile_decode`, `share_prompt_prefix`), the levers and the device decide.
Their gains are measured in docs/benchmarks.md.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from .._compat import (
    accepts_logits_to_keep,
    cache_argument_name,
    can_drop_cache_rows,
    expand_cache,
    last_position_to_keep,
    output_cache,
    static_cache_from,
    unwrap_peft,
)
from .._logging import warn_once
from ..core.tensors import position_ids_from_mask
from .admission import scaled_difference
from .levers import admitted, relative_difference, verdict

__all__ = ["DecodeSettings", "Decoder", "StaticDecoder", "static_width"]

logger = logging.getLogger(__name__)

WIDTH_BUCKET = 64  # the static cache's width is a multiple of this


@dataclass(frozen=True)
class DecodeSettings:
    """How the decode loop runs (not what it samples): prefix sharing, the KV cache, compilation.

    The default is the dynamic loop: the cache grows a column per token and finished rows leave
    the batch. `static_cache` preallocates the cache and the attention mask at a fixed width
    (`rollout/static_decode.py`): every row stays, shapes never change and the loop reads nothing
    back to the host between checks, which is what `compile` (torch.compile of the model's
    decode step; CUDA graphs on a GPU) needs. Same tokens as the dynamic loop for the same draws.
    """

    static_cache: bool = False  # a preallocated KV cache and mask (TRL's cache_implementation)
    compile: bool = False  # torch.compile the decode step (implies static_cache)
    # steps between the host's "has every row finished?" checks; 0: 1 on a CPU (a check costs
    # nothing there), 16 on an accelerator (each check waits for the device)
    check_every: int = 0
    shared_prefill: bool = True  # may a group's prompt be prefilled once (share_prompt_prefix)

    def __post_init__(self) -> None:
        if self.check_every < 0:
            raise ValueError(f"check_every must be >= 0 (0: by device), got {self.check_every}.")

    @property
    def static(self) -> bool:
        return self.static_cache or self.compile


def static_width(prompt_width: int, max_new_tokens: int) -> int:
    """The static cache's width: the prompt, the new tokens, rounded up to `WIDTH_BUCKET`."""
    need = prompt_width + max_new_tokens
    return -(-need // WIDTH_BUCKET) * WIDTH_BUCKET


class Decoder:
    """Runs the causal LM forward with an explicit cache and returns last-position float32
    logits. Built once per rollout (the peft wrapper is looked through here, once)."""

    def __init__(self, model: torch.nn.Module, settings: DecodeSettings | None = None):
        self.model = unwrap_peft(model)
        self.settings = settings or DecodeSettings()
        self.cache_arg = cache_argument_name(self.model)
        self.keeps_last_only = accepts_logits_to_keep(self.model)
        self.device = next(self.model.parameters()).device

    def prefill(self, unique_ids, unique_mask, group_size: int, share: bool):
        """Prefill the P prompts `(P, Lp)` for their N = P * G rows: `(last logits (N, V), cache,
        prefilled tokens)`. With `share` and lever `shared_prefill`, each prompt is encoded once
        and its cache expanded to its G rows (TRL without vLLM prefills all N); the first time
        this meets a model it is checked against every row prefilled, whose result is used
        when the check turns the lever off."""
        known = verdict("shared_prefill", self.model)  # None: not checked on this model yet
        if share and self.settings.shared_prefill and known is not False:
            logits, cache = self(unique_ids, unique_mask, position_ids_from_mask(unique_mask))
            if cache is not None and expand_cache(cache, group_size):
                logits = logits.repeat_interleave(group_size, 0)  # (N, V)
                shared = logits, cache, int(unique_mask.sum())
                if known:
                    return shared
                every_row = self._every_row(unique_ids, unique_mask, group_size)
                difference = relative_difference(logits, every_row[0])
                ok = admitted("shared_prefill", self.model, self.scaled(difference))
                return shared if ok else every_row
            warn_once(
                "gen-share",
                "share_prompt_prefix: this model's KV cache cannot be expanded along the "
                "batch; prefilling every row instead (slower, same result).",
            )
        return self._every_row(unique_ids, unique_mask, group_size)

    def _every_row(self, unique_ids, unique_mask, group_size: int):
        """The reference prefill: each prompt's G rows encoded apart."""
        ids = unique_ids.repeat_interleave(group_size, 0)  # (N, Lp)
        mask = unique_mask.repeat_interleave(group_size, 0)  # (N, Lp)
        logits, cache = self(ids, mask, position_ids_from_mask(mask))
        return logits, cache, int(mask.sum())

    def scaled(self, difference: float) -> float:
        """An admission check's difference in float32 terms for this model's dtype."""
        return scaled_difference(difference, next(self.model.parameters()).dtype)

    def can_drop_rows(self, cache: Any) -> bool:
        """Whether finished rows can leave this cache (and the batch)."""
        return can_drop_cache_rows(cache)

    def keep_rows(self, cache: Any, keep: torch.Tensor) -> None:
        """Keep only the rows `keep` `(A',)` of `cache`, in place."""
        cache.batch_select_indices(keep)

    def static(self, logits, cache, attention, max_new_tokens: int) -> StaticDecoder | None:
        """A `StaticDecoder` holding what the prefilled dynamic `cache` holds (`attention` `(A, W)`,
        last `logits` `(A, V)`), wide enough for `max_new_tokens`; None where this model's cache
        cannot be made static or its admission check turned the lever off (the dynamic loop
        then runs, same tokens)."""
        width = static_width(attention.shape[1], max_new_tokens)
        static = static_cache_from(cache, self.model.config, width)
        if static is None:
            warn_once(
                "static-cache",
                "cache_implementation='static' / compile_decode: this model's KV cache has "
                "sliding-window or hybrid layers, which the static loop does not handle; decoding "
                "with the dynamic cache instead (same tokens, not compiled).",
            )
            return None
        decoder = StaticDecoder(self, width, static)
        decoder.announce(attention.shape[0])
        known = verdict(decoder.lever, self.model)
        if known is None:  # checked on copies of both caches: the loop's stay untouched
            probe_static = static_cache_from(cache, self.model.config, width)
            known = decoder.admit(self, logits, copy.deepcopy(cache), attention, probe_static)
        return decoder if known else None

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


def _static_lever(settings: DecodeSettings) -> str:
    return "compiled_decode" if settings.compile else "static_decode"


class StaticDecoder:
    """The model's decode step at fixed shapes, eager or compiled: `(ids, mask, positions,
    cache) -> (logits (A, V), cache)`, the same interface as `Decoder`; `cache` is the static
    cache it was built with (`Decoder.static`)."""

    def __init__(self, decoder: Decoder, width: int, cache: Any) -> None:
        self.model, compile = decoder.model, decoder.settings.compile
        self.width = width  # the static cache's columns
        self.cache = cache
        self.cache_arg, self.last_only = decoder.cache_arg, decoder.keeps_last_only
        self.device = decoder.device
        self.mode = (
            ("reduce-overhead" if self.device.type == "cuda" else "default") if compile else ""
        )
        self.lever = _static_lever(decoder.settings)
        self.step = _compiled(self.mode) if compile else _decode_step
        self._compiling: tuple | None = None  # the shape whose first step compiles, and when
        if compile and self.device.type == "cpu":
            warn_once(
                "compile-cpu",
                "compile_decode on a CPU: measured slower or barely faster than the eager loop "
                "(docs/benchmarks.md); it is meant for GPUs (CUDA graphs).",
            )

    def admit(self, dynamic: Decoder, logits, cache, attention, static_cache) -> bool:
        """Lever `static_decode` / `compiled_decode`, once per model: one step of the argmax
        tokens on `static_cache` (a copy of this decoder's) against the dynamic decoder's step
        on `cache` (a copy of the prefilled dynamic cache)."""
        probe = logits.argmax(-1, keepdim=True)  # (A, 1)
        width = attention.shape[1]
        positions = attention.sum(-1, keepdim=True)  # (A, 1)
        grown = torch.cat([attention, attention.new_ones(len(probe), 1)], dim=1)  # (A, W + 1)
        reference, _ = dynamic(probe, grown, positions, cache)
        mask = torch.cat([attention, attention.new_zeros(len(probe), self.width - width)], 1)
        mask[:, width] = 1
        fast, _ = self(probe, mask, positions, static_cache)
        difference = relative_difference(fast, reference)
        return admitted(self.lever, self.model, dynamic.scaled(difference))

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
