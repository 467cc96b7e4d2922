"""CPU memory reuse between steps (`cpu_memory_reuse`, on by default).

On a CPU torch gets each tensor from malloc and gives it back on free. glibc serves blocks over its
mmap threshold (128 KB at first, rising to at most 32 MB) with fresh pages and returns them to the
OS on free, so every step's large tensors (the LM head's logits above all) fault in new, zeroed
pages, which costs several times the arithmetic into a reused buffer.

Two settings, applied once when training starts with the policy on the CPU:
- malloc keeps blocks up to 32 MB on its heap and up to 256 MB of freed memory for reuse, in one
  arena, as a GPU's caching allocator does; the process's RSS then stays near its peak between
  steps;
- `logprob_chunk_size` is cut to the largest power of two whose float32 logits chunk stays under
  32 MB (128 positions for a 49,152-token vocabulary), so those chunks are reused too.

Measured in docs/benchmarks.md ("Fresh pages on every step"): both settings together save a
tenth to a fifth of a `short` step on the CPU it was built on; either alone gained little.
Results are unchanged: the
chunking changes no number (each position's log-softmax is computed whole), and malloc settings
only change where memory comes from.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from .._compat import HEAP_BLOCK_BYTES, reuse_freed_cpu_memory
from .levers import Levers

logger = logging.getLogger(__name__)


def heap_chunk_size(vocab_size: int) -> int:
    """The largest power of two of LM-head positions whose `(C, V)` float32 logits stay under
    `HEAP_BLOCK_BYTES` (at least 1)."""
    rows = max(1, (HEAP_BLOCK_BYTES - 4096) // (4 * vocab_size))  # 4096: malloc's own header
    return 1 << (rows.bit_length() - 1)


def prepare(args: Any, model: torch.nn.Module, levers: Levers) -> None:
    """Apply both settings when `args.cpu_memory_reuse` is on, `levers` allow it (a CPU plan,
    fast paths on) and `model` is on the CPU. `args.logprob_chunk_size` may be cut in place."""
    device = next(model.parameters()).device
    if not (args.cpu_memory_reuse and levers.cpu_memory_reuse) or device.type != "cpu":
        return
    if not reuse_freed_cpu_memory():
        logger.info("cpu_memory_reuse: the C library is not glibc; malloc left as it is")
        return
    vocab = model.get_output_embeddings().weight.shape[0]  # as the autopilot reads it
    chunk = min(args.logprob_chunk_size, heap_chunk_size(vocab))
    if chunk < args.logprob_chunk_size:
        logger.info(
            "cpu_memory_reuse: logprob_chunk_size %d -> %d (float32 logits of %d tokens stay "
            "under 32 MB, so malloc reuses them)",
            args.logprob_chunk_size,
            chunk,
            vocab,
        )
        args.logprob_chunk_size = chunk
