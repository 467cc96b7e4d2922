"""What a run dir holds (an adapter or full weights), the run's policy loaded for inference
(`chat`, `generate`), and the one merge path: a LoRA adapter merged into a float32 reload of its
base (`publish --merge`, `export --gguf`). Every load goes through `policy.py`."""

from __future__ import annotations

import logging
from pathlib import Path

from ..models.model_source import check_model_source
from ..run.rundir import load_run_info

logger = logging.getLogger(__name__)

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def model_kind(output_dir: Path) -> str:
    """ "adapter" or "full"; a ValueError saying what is missing otherwise."""
    if not output_dir.is_dir():
        raise ValueError(f"Output dir {output_dir} does not exist; pass the output_dir of a run.")
    has = {name: (output_dir / name).is_file() for name in ADAPTER_FILES}
    if all(has.values()):
        return "adapter"
    weights = list(output_dir.glob("model*.safetensors"))
    if (output_dir / "config.json").is_file() and weights:
        return "full"
    missing = [name for name, present in has.items() if not present]
    present = sorted(p.name for p in output_dir.iterdir())[:20]
    raise ValueError(
        f"{output_dir} holds no adapter and no full model: missing {', '.join(missing)} "
        "(or, for a full model, config.json + model.safetensors). "
        f"Found: {', '.join(present) or 'nothing'}. Point this at a finished run's output_dir "
        "or one of its checkpoint-N dirs."
    )


def base_model_ref(output_dir: str | Path) -> str:
    """The base an adapter was trained on: `grpo_run.json`'s `base_model_path`, else the adapter
    config's `base_model_name_or_path`; a ValueError saying how to fix it if neither names one."""
    from peft import PeftConfig

    run = load_run_info(output_dir)
    base_ref = run.get("base_model_path") or run.get("base_model")
    base_ref = base_ref or PeftConfig.from_pretrained(str(output_dir)).base_model_name_or_path
    if not base_ref:
        raise ValueError(
            f"Cannot merge: neither grpo_run.json nor adapter_config.json in {output_dir} names the "
            "base model. Add 'base_model_path' to grpo_run.json."
        )
    check_model_source(base_ref)  # a base that moved: one line, before anything loads
    return base_ref


def merged_model(output_dir: str | Path):
    """The base reloaded in float32 (from `base_model_ref`) with the adapter merged in: the one
    merge path (`publish --merge`, `export --gguf`).

    Works for an adapter trained on a 4-bit base: LoRA weights are stored unquantised, so they load
    onto plain `nn.Linear` layers; the merged weights are then W + (alpha / r) B A in float32.
    """
    import torch

    from ..models.policy import load_adapter, load_model

    base_ref = base_model_ref(output_dir)
    logger.info("Merging the adapter into %s reloaded in float32", base_ref)
    base = load_model(base_ref, {"dtype": torch.float32})
    return load_adapter(base, output_dir).merge_and_unload()


def merge_adapter(output_dir: str | Path, target_dir: str | Path) -> Path:
    """`merged_model(output_dir)` saved to `target_dir`."""
    merged_model(output_dir).save_pretrained(target_dir)
    return Path(target_dir)


def trained_policy(output_dir: str | Path):
    """`(model, tokenizer)`: the run's policy as trained, for inference (`grpo-plugin chat`): its
    base with the LoRA adapter on top (not merged), or the full fine-tune, in `default_dtype()`,
    in eval mode; and the tokenizer saved with the run (its chat template), else the base's.

    An adapter trained on a 4-bit base goes on the unquantised base, as `merged_model` does."""
    from ..models.policy import load_adapter, load_policy, load_tokenizer

    path = Path(output_dir)
    if model_kind(path) == "adapter":
        model, tokenizer = load_policy(base_model_ref(path))
        model = load_adapter(model, path)
    else:
        model, tokenizer = load_policy(str(path))
    if (path / "tokenizer_config.json").is_file():
        tokenizer = load_tokenizer(model, str(path))
    return model.eval(), tokenizer
