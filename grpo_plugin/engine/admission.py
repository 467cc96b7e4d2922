"""The training forward's admission checks: each lever against the reference path, once per
model, on the first batch it meets (engine/levers.py says what each compares, within what).

A check runs without grad and with every module in eval mode (no dropout: both forms see the
same function and no random numbers are drawn) and with float32 products (bf16_products.py),
then puts the modes back. It costs one more
forward of the first micro-batch per lever, once per model.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

import torch

from .._compat import set_training_flags, training_flags
from .bf16_products import bf16_products
from .levers import admitted, relative_difference, verdict

__all__ = ["admit_frozen_head", "admit_hidden", "scaled_difference"]

_HALF_EPSILONS = 8  # a half-precision model's tolerance: this many of its dtype's epsilons


@contextmanager
def _checking(module: torch.nn.Module):
    flags = training_flags(module)
    set_training_flags(module, False)
    try:
        with torch.no_grad(), bf16_products(False):  # float32 forms on both sides
            yield
    finally:
        set_training_flags(module, flags)


def scaled_difference(difference: float, dtype: torch.dtype) -> float:
    """A half-precision model's difference in float32 terms: these levers' tolerance (1e-4) is
    for float32; in bf16 / fp16 it is `_HALF_EPSILONS` epsilons of the dtype instead."""
    if dtype in (torch.bfloat16, torch.float16):
        return difference * 1e-4 / (_HALF_EPSILONS * torch.finfo(dtype).eps)
    return difference


def admit_hidden(name: str, body: torch.nn.Module, fast: Callable, reference: Callable, real):
    """Lever `name` of the training forward on `body`: `fast()` and `reference()` give `(N, T,
    H)` hidden states (fast: None where the lever declines the model), compared at the `(N, T)`
    `real` completion positions. True when admitted (now or before)."""
    known = verdict(name, body)
    if known is not None:
        return known
    with _checking(body):
        fast_hidden = fast()
        if fast_hidden is None:  # the lever declined this batch or model itself: no verdict
            return True
        reference_hidden = reference()
    real = real.bool()
    difference = relative_difference(fast_hidden[real], reference_hidden[real])
    return admitted(name, body, scaled_difference(difference, reference_hidden.dtype))


def admit_frozen_head(head: torch.nn.Module, fast: Callable, reference: Callable, hidden):
    """Lever `frozen_head` on `head`: `fast(h)` and `reference(h)` give `(logps (C,), entropy
    (C,))` of the positions `hidden` `(C, H)`; their log-probs, entropies and the gradients of
    the log-probs' sum with respect to `h` are compared. True when admitted (now or before)."""
    known = verdict("frozen_head", head)
    if known is not None:
        return known
    results = []
    for form in (fast, reference):
        h = hidden.detach().clone().requires_grad_(True)
        with torch.enable_grad():
            logps, entropy = form(h)
            (grad,) = torch.autograd.grad(logps.sum(), h)
        results.append((logps.detach(), entropy.detach(), grad))
    difference = max(relative_difference(a, b) for a, b in zip(*results, strict=True))
    return admitted("frozen_head", head, scaled_difference(difference, hidden.dtype))
