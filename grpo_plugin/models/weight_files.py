"""A local model or adapter folder's weight files, checked without loading a tensor.

A folder with `config.json` and a tokenizer but no weights, or with a truncated
`model.safetensors`, passed every check before the load and then failed in transformers with a
long traceback (`no file named model.safetensors`, `SafetensorError: invalid header length`).
`check_model_weights` and `check_adapter_weights` read what the loader will read first: which
weight files the folder holds (a sharded checkpoint's index and every shard it names) and each
safetensors file's header (8 bytes of length, then a JSON header whose largest data offset the
file must reach). Each problem raises ValueError with one line naming the folder and the file.

Folders this cannot judge pass unchanged: weights under a `variant` name or in a GGUF file (the
`model_init_kwargs` that select them are the loader's), a `pytorch_model.bin` in the legacy
(non-zip) pickle format.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
PYTORCH, PYTORCH_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
# weights the loader may be told to take instead (`variant`, `gguf_file`): not judged here
_OTHER_WEIGHTS = ("model.*.safetensors", "pytorch_model.*.bin", "*.gguf")
_MAX_HEADER = 100_000_000  # what safetensors itself refuses


def check_safetensors_file(path: Path) -> None:
    """`path` holds a whole safetensors file: a header that parses, and every tensor's bytes."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else None
        if length is None or length > _MAX_HEADER:
            raise ValueError(
                f"{path}: not a safetensors file (no valid header length in its first 8 bytes); "
                "copy or save the model again."
            )
        if length > size - 8:
            raise ValueError(
                f"{path}: truncated ({size} bytes, shorter than its {length}-byte header); copy "
                "or save the model again."
            )
        try:
            header = json.loads(f.read(length))
            ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            raise ValueError(
                f"{path}: its safetensors header is not valid JSON; the file is broken: copy or "
                "save the model again."
            ) from None
    needed = 8 + length + max(ends, default=0)
    if size < needed:
        raise ValueError(
            f"{path}: truncated ({size} bytes of the {needed} its header describes); copy or "
            "save the model again."
        )


def _check_pytorch_file(path: Path) -> None:
    """A zip-format `torch.save` file (what transformers writes) must end with its directory."""
    with path.open("rb") as f:
        zipped = f.read(2) == b"PK"
    if zipped and not zipfile.is_zipfile(path):
        raise ValueError(f"{path}: truncated (an incomplete zip archive); copy or save it again.")


def _check_index(folder: Path, index_name: str) -> list[Path]:
    """The shards a sharded checkpoint's index names, each present; returns them."""
    index = folder / index_name
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        names = sorted(set(weight_map.values()))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        raise ValueError(
            f"{index}: not a readable shard index (a JSON object with a `weight_map`); copy or "
            "save the model again."
        ) from None
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        raise ValueError(
            f"model folder {folder}: {index_name} names {len(names)} shard(s), but "
            f"{', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''} is missing; copy "
            "every shard."
        )
    return [folder / name for name in names]


def _check_file(path: Path) -> None:
    if path.suffix == ".safetensors":
        check_safetensors_file(path)
    else:
        _check_pytorch_file(path)


def check_model_weights(folder: Path) -> None:
    """A local model folder holds weights the loader can read, in transformers' order: the
    safetensors file, its shards, then the PyTorch file, its shards."""
    for name in (SAFETENSORS, SAFETENSORS_INDEX, PYTORCH, PYTORCH_INDEX):
        if not (folder / name).is_file():
            continue
        sharded = name.endswith(".index.json")
        for path in _check_index(folder, name) if sharded else [folder / name]:
            _check_file(path)
        return
    if any(next(folder.glob(pattern), None) for pattern in _OTHER_WEIGHTS):
        return  # a variant or a GGUF file: the loader's keywords decide
    raise ValueError(
        f"model folder {folder} holds no weights ({SAFETENSORS}, a sharded "
        f"{SAFETENSORS_INDEX} with its shards, or {PYTORCH}); copy them in, or save the model "
        "with save_pretrained."
    )


def check_adapter_weights(folder: Path) -> None:
    """A LoRA adapter folder holds its weights, whole (`adapter_model.safetensors` or `.bin`)."""
    for name in ADAPTER_WEIGHTS:
        if (folder / name).is_file():
            _check_file(folder / name)
            return
    raise ValueError(
        f"adapter {folder} has adapter_config.json but no {ADAPTER_WEIGHTS[0]} (nor "
        f"{ADAPTER_WEIGHTS[1]}); copy the adapter's weights in, or pass the run's output_dir."
    )
