"""The static-shape decode loop (`DecodeSettings.static_cache`, `DecodeSettings.compile`).

The dynamic loop in `generation.py` grows the KV cache by one column per token, drops finished
rows from the batch, and asks the host after every step whether all rows have finished. Each of
those is a new shape or a device-to-host read, and a compiler (torch.compile, CUDA graphs) needs
neither. This loop:

- runs on the engine's static decoder (`engine/decode.py`), whose `StaticCache` holds the prefill
  and is as wide as the prompt plus `max_new_tokens`, rounded up (fewer shapes to compile);
- keeps one attention mask of that width and writes a 1 into the next column each step, in place;
- keeps every row to the end (finished rows decode padding that nobody reads);
- reads `finished.all()` back only every `check_every` steps (every step on a CPU, where it costs
  nothing; every 16 on a GPU), then trims the columns decoded after the last row's end.

The decode step (the model's forward plus the last position's logits) can be compiled:
`torch.compile(..., dynamic=False)`, with CUDA graphs (`mode="reduce-overhead"`) on a GPU. It
compiles once per shape (rows, cache width) and model, which takes a while on a CPU
(docs/benchmarks.md, history, "The decode loop", has the measurements).

For the same draws the tokens are the dynamic loop's: each row reads the same uniform at each
step (`noise.uniforms(rows, t)`), and masked columns add exact zeros to attention. Compiled
kernels may round differently in the last bits of a logit, which can flip a draw that falls
within that rounding of a token boundary.
"""

from __future__ import annotations

import logging

import torch

from ..engine.decode import StaticDecoder
from .sampler import DecodeTrace
from .types import Decoded, DecodeSpec

logger = logging.getLogger(__name__)


def decode_static(
    decoder: StaticDecoder,
    logits: torch.Tensor,
    attention: torch.LongTensor,
    spec: DecodeSpec,
    seen: torch.Tensor | None = None,
) -> Decoded:
    """The loop over the rows the engine's static decoder holds (`Decoder.static`, its cache
    prefilled), from their last `logits` `(A, V)` and `attention` `(A, W)`. `generation.decode`'s contract (tokens, live, finished, log-probs; `seen`
    updated in place; `spec.on_step` after each step), every row kept, at fixed shapes."""
    rows, device, cache = logits.shape[0], logits.device, decoder.cache
    trace = DecodeTrace(rows, spec, device)
    prompt_width = attention.shape[1]
    extra = decoder.width - prompt_width
    mask = torch.cat([attention, attention.new_zeros(rows, extra)], dim=1)  # (A, W')
    every = spec.engine.check_every or (1 if device.type == "cpu" else 16)
    all_rows = torch.arange(rows, device=device)  # (A,)
    first_position = attention.sum(-1, keepdim=True)  # (A, 1) each row's next position
    fast = device.type == "cpu"  # the sampler's candidate path reads ties back to the host
    steps = spec.sampling.max_new_tokens
    for step in range(steps):
        picked = trace.step(logits, seen, all_rows, step, fast=fast)  # (A,)
        if step == steps - 1 or ((step + 1) % every == 0 and bool(trace.finished.all())):
            break
        if seen is not None:
            seen.scatter_(1, picked.unsqueeze(-1), True)
        mask[:, prompt_width + step] = 1  # in place: the step's shapes never change
        logits, cache = decoder(picked.unsqueeze(-1), mask, first_position + step, cache)
    used = int(torch.stack(trace.live, dim=1).any(dim=0).sum())  # steps to the last row's end
    return trace.decoded(cache, mask[:, : prompt_width + used], steps=used)
