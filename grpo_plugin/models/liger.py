"""`use_liger_kernel=True`, decided case by case with TRL 1.16's reasons, before anything loads.

TRL refuses Liger's fused GRPO loss where it cannot serve, and says why:

- a prompt-learning PEFT adapter (prompt tuning, prefix tuning, ...): its virtual tokens are
  added by `PeftModel.forward`, which the fused loss bypasses (it runs the decoder and reads the
  LM head weight itself), so the loss would be computed on the wrong sequence;
- a PEFT adapter on `lm_head`: the fused loss reads `lm_head.weight` directly, so the adapter
  would never train (`modules_to_save=["lm_head"]` trains a full copy of the head, and is fine);
- liger-kernel not installed: an ImportError naming the package.

Where TRL would then use the fused loss, ours still refuses, in one line: log-probs here come from
our own chunked LM head (`logprob_chunk_size`), which bounds the logits' memory as Liger's fused
loss does, and from the prefix-shared forward, which Liger's patched forward would bypass. That is
the one remaining difference (docs/differences-from-trl.md).
"""

from __future__ import annotations

import importlib.util
from typing import Any


def _adapter_configs(model: Any, peft_config: Any) -> list[Any]:
    """The PEFT configs in play: `peft_config`, and those of a `PeftModel` passed as the model."""
    configs = [peft_config] if peft_config is not None else []
    return configs + list(getattr(model, "peft_config", {}).values())


def _targets_lm_head(config: Any) -> bool:
    targets = getattr(config, "target_modules", None) or ()
    if isinstance(targets, str):  # a regex over module names
        return "lm_head" in targets
    return any(str(t).split(".")[-1] == "lm_head" for t in targets)


def check_liger(args: Any, model: Any, peft_config: Any) -> None:
    """Raise for `use_liger_kernel=True` (see the module docstring); nothing when it is False."""
    if not getattr(args, "use_liger_kernel", False):
        return
    for config in _adapter_configs(model, peft_config):
        if getattr(config, "is_prompt_learning", False):
            raise ValueError(
                "use_liger_kernel=True does not support prompt-learning PEFT adapters "
                f"({type(config).__name__}): their virtual tokens are added by PeftModel.forward, "
                "which Liger's fused loss bypasses; use LoRA, or set use_liger_kernel=False."
            )
        if _targets_lm_head(config):
            raise ValueError(
                "use_liger_kernel=True with a PEFT adapter on lm_head: Liger's fused loss reads "
                "lm_head.weight directly, so the adapter would never train; remove 'lm_head' from "
                "target_modules (modules_to_save=['lm_head'] trains the head), or set "
                "use_liger_kernel=False."
            )
    if importlib.util.find_spec("liger_kernel") is None:
        raise ImportError(
            "use_liger_kernel=True needs liger-kernel (pip install liger-kernel), and this "
            "trainer would then refuse it (its chunked LM head bounds the logits' memory as "
            "Liger's fused loss does): set use_liger_kernel=False."
        )
    raise ValueError(
        "use_liger_kernel=True is not supported: log-probs come from our chunked LM head "
        "(logprob_chunk_size bounds the logits' memory, as Liger's fused loss does) and "
        "prefix-shared forward, which Liger's patched forward and fused loss would bypass; "
        "set use_liger_kernel=False."
    )
