"""The engine's fast paths ("levers"), which ones a run may take, and their admission checks.

Every lever computes what the reference path computes (plain transformers + peft through their
public APIs), faster; `packed_bf16` and `bf16_training` compute it in bf16, to bf16's rounding.
Each is named here, with where it applies, the check that admits it the first time it meets a
model and the tolerance of that check (`LEVERS`). A lever whose check
fails is turned off for that model with one log line naming it and the measured difference;
the run goes on, on the reference path.

`Levers` says which levers may run. `fast_paths: false` (GRPOConfig) or the environment variable
`GRPO_PLUGIN_FAST_PATHS=0` turns them all off: every forward then runs the reference path.
"""

from __future__ import annotations

import logging
import os
import weakref
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

__all__ = [
    "LEVERS",
    "Lever",
    "Levers",
    "admitted",
    "default_levers",
    "fast_paths_from_env",
    "relative_difference",
]

logger = logging.getLogger(__name__)
ENV_VARIABLE = "GRPO_PLUGIN_FAST_PATHS"


@dataclass(frozen=True)
class Lever:
    """One fast path: where it runs, what admits it, within what."""

    where: str  # the module that implements it
    applies: str  # the conditions under which it runs
    check: str  # its admission check, the first time it meets a model
    tolerance: float  # the largest relative difference the check accepts (0: bit for bit)


LEVERS: dict[str, Lever] = {
    "fused_lora": Lever(
        "engine/fused_lora.py",
        "peft LoRA Linear layers in the plain case (no dropout, DoRA, hooks, casts, 4-bit)",
        "every fused layer against peft's own forward, on random input with a random B",
        1e-5,
    ),
    "frozen_head": Lever(
        "engine/lm_head.py",
        "a frozen nn.Linear LM head (LoRA, QLoRA) under grad",
        "the first chunk's log-probs and hidden-state gradients against the checkpointed head",
        1e-4,
    ),
    "shared_prompt": Lever(
        "engine/forward.py",
        "share_prompt_prefix: groups of rows sharing their prompt, a batch-expandable cache",
        "the first micro-batch's hidden states against the plain forward's",
        1e-4,
    ),
    "padding_free": Lever(
        "engine/padding_free.py",
        "padding_free with the shared prompt: SDPA attention, no sliding windows",
        "the first packed micro-batch's hidden states against the padded forward's",
        1e-4,
    ),
    "packed_bf16": Lever(
        "engine/kernels.py",
        "a bf16 rollout copy on an x86 CPU whose torch packs oneDNN weights",
        "every packed layer against F.linear on random input",
        1e-2,
    ),
    "shared_prefill": Lever(
        "engine/decode.py",
        "share_prompt_prefix in the rollouts: a group's prompt prefilled once, a batch-expandable "
        "cache",
        "the first prefill's last-position logits against every row prefilled",
        1e-4,
    ),
    "static_decode": Lever(
        "engine/decode.py",
        "cache_implementation='static': single-turn rollouts, full-attention layers",
        "one step on the static cache against the dynamic cache's step, from the same prefill",
        1e-4,
    ),
    "compiled_decode": Lever(
        "engine/decode.py",
        "compile_decode (None: on CUDA): single-turn rollouts, full-attention layers",
        "one compiled step against the dynamic cache's eager step, from the same prefill",
        1e-3,
    ),
    "bf16_training": Lever(
        "engine/bf16_products.py",
        "train_precision='bf16' (asked for; not the default), a CPU with AVX512-BF16 or AMX: "
        "the fused LoRA layers' frozen base products in bf16 in the training forward and "
        "backward, float32 master weights",
        "every fused layer's bf16 product against its float32 product, on random input",
        1e-2,
    ),
    "cpu_memory_reuse": Lever(
        "engine/memory.py",
        "training on a CPU with glibc (cpu_memory_reuse)",
        "none needed: it changes where memory comes from, never a number",
        0.0,
    ),
}


_ENV_WORDS = {"1": True, "true": True, "on": True, "yes": True}
_ENV_WORDS.update({"0": False, "false": False, "off": False, "no": False})


def fast_paths_from_env() -> bool:
    """False when the environment says `GRPO_PLUGIN_FAST_PATHS=0` (or false / off / no); any
    word but those and 1 / true / on / yes is refused, naming the variable."""
    value = os.environ.get(ENV_VARIABLE, "1")
    word = value.strip().lower()
    if word not in _ENV_WORDS:
        raise ValueError(
            f"{ENV_VARIABLE}={value!r}: set it to 0 (every fast path off: the reference path) "
            "or 1 (the default), or unset it."
        )
    return _ENV_WORDS[word]


@dataclass(frozen=True)
class Levers:
    """Which levers may run (each still needs its conditions and its admission check)."""

    fused_lora: bool = True
    frozen_head: bool = True
    shared_prompt: bool = True
    padding_free: bool = True
    packed_bf16: bool = True
    shared_prefill: bool = True
    static_decode: bool = True
    compiled_decode: bool = True
    bf16_training: bool = True
    cpu_memory_reuse: bool = True

    @classmethod
    def reference(cls) -> Levers:
        """Every lever off: the reference path everywhere."""
        return cls(**{f.name: False for f in fields(cls)})

    def only(self, **switches: bool) -> Levers:
        """These levers, with some switched (each stays off where it is off already)."""
        return replace(self, **{k: getattr(self, k) and v for k, v in switches.items()})

    @property
    def names(self) -> list[str]:
        """The levers that are on."""
        return [f.name for f in fields(self) if getattr(self, f.name)]


def default_levers(fast_paths: bool = True) -> Levers:
    """`Levers()` unless `fast_paths` is False or the environment turns them off."""
    return Levers() if fast_paths and fast_paths_from_env() else Levers.reference()


# lever name -> {model (weakly): (admitted, measured difference)}
_VERDICTS: dict[str, weakref.WeakKeyDictionary] = {n: weakref.WeakKeyDictionary() for n in LEVERS}


def verdict(name: str, owner: Any) -> bool | None:
    """The admission check's verdict for lever `name` on `owner` (a model or module); None when
    it has not run yet."""
    found = _VERDICTS[name].get(owner)
    return None if found is None else found[0]


def admitted(name: str, owner: Any, difference: float) -> bool:
    """Record the admission check of lever `name` on `owner`: admitted when `difference` (the
    relative difference the check measured) is within the lever's tolerance, else turned off
    for `owner` with one log line. Returns the verdict."""
    tolerance = LEVERS[name].tolerance
    ok = difference <= tolerance
    _VERDICTS[name][owner] = (ok, difference)
    if not ok:
        logger.warning(
            "fast path %r turned off for %s: its output differs from the reference path by %.3g "
            "(relative; tolerance %.3g); continuing on the reference path",
            name,
            type(owner).__name__,
            difference,
            tolerance,
        )
    return ok


def relative_difference(fast: torch.Tensor, reference: torch.Tensor) -> float:
    """max |fast - reference| / max(max |reference|, 1e-6), in float32 (inf for other shapes or
    for non-finite values the reference does not have)."""
    if fast.shape != reference.shape:
        return float("inf")
    fast, reference = fast.detach().float(), reference.detach().float()
    if not bool(torch.equal(fast.isfinite(), reference.isfinite())):
        return float("inf")
    finite = reference.isfinite()
    if not bool(finite.any()):
        return 0.0
    scale = reference[finite].abs().max().clamp_min(1e-6)
    return float((fast[finite] - reference[finite]).abs().max() / scale)
