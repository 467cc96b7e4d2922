"""Is a checkpoint whole? Every file read and checked before a resume changes anything.

    damage        what is wrong with one file (None: whole, or of a kind not checked)
    check_folder  the first damaged file of a checkpoint folder, refused in one line

What is checked, by kind, without unpickling or loading anything:
- `*.pt`, `*.pth`, `*.bin` (torch.save's zip archives: optimizer, scheduler, RNG states, the
  trainer's own state, training_args): the archive's directory, then every member read and its
  CRC-32 compared. A truncated file has no directory; a flipped byte fails its CRC (torch itself
  does not check them: a flipped byte in `optimizer.pt` resumed silently with exit 0).
- `*.safetensors`: the header parses and the file is exactly as long as the header says (the
  format has no checksum: a flipped byte in the tensor data cannot be seen).
- `*.json`: it parses.
Other files (README.md, tokenizer files other than JSON, ...) are not checked.

Reading every byte costs what the resume reads anyway; a folder already checked by this process
(the CLI checks before the model loads, the trainer again) is not read twice unless it changed.
"""

from __future__ import annotations

import json
import os
import struct
import zipfile
from pathlib import Path

_ZIP_MAGIC = b"PK\x03\x04"
_PICKLE_MAGIC = 0x80  # torch.save's legacy (non-zip) format starts with a pickle protocol byte
_TORCH_SUFFIXES = {".pt", ".pth", ".bin"}
_checked: dict[str, tuple] = {}  # folder -> the stat signature it had when found whole


class DamagedCheckpoint(ValueError):
    """A checkpoint file that is truncated or corrupt (one line naming it)."""


def _zip_damage(path: Path) -> str | None:
    with path.open("rb") as fh:
        head = fh.read(4)
    if not head:
        return "it is empty"
    if head != _ZIP_MAGIC:
        return None if head[0] == _PICKLE_MAGIC else "it is not a torch archive"
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as err:
        return f"its archive is cut short or corrupt ({err})"
    return f"{bad} inside it fails its checksum" if bad else None


def _safetensors_damage(path: Path) -> str | None:
    size = path.stat().st_size
    with path.open("rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            return "it is shorter than a safetensors header"
        (header_len,) = struct.unpack("<Q", raw)
        if 8 + header_len > size:
            return "it is cut short inside its header"
        try:
            header = json.loads(fh.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return "its header is not valid JSON"
    ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
    expected = 8 + header_len + max(ends, default=0)
    if size != expected:
        return f"it holds {size} bytes where its header describes {expected}"
    return None


def _json_damage(path: Path) -> str | None:
    try:
        json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        return f"it is not valid JSON ({err})"
    return None


def damage(path: str | Path) -> str | None:
    """What is wrong with `path` (None: whole, or of a kind not checked)."""
    path = Path(path)
    suffix = path.suffix
    if suffix in _TORCH_SUFFIXES:
        return _zip_damage(path)
    if suffix == ".safetensors":
        return _safetensors_damage(path)
    if suffix == ".json":
        return _json_damage(path)
    return None


def _signature(folder: Path) -> tuple:
    return tuple(
        sorted(
            (str(p.relative_to(folder)), st.st_size, st.st_mtime_ns)
            for p in folder.rglob("*")
            if p.is_file() and (st := p.stat())
        )
    )


def first_damaged(folder: str | Path) -> tuple[Path, str] | None:
    """(file, what is wrong) of the first damaged file in `folder`, None when all are whole."""
    folder = Path(folder)
    key, signature = os.path.realpath(folder), _signature(folder)
    if _checked.get(key) == signature:
        return None
    for name, _, _ in signature:
        path = folder / name
        problem = damage(path)
        if problem is not None:
            return path, problem
    _checked[key] = signature
    return None


def check_folder(folder: str | Path, fix: str) -> None:
    """Raise `DamagedCheckpoint` (one line: the file, what is wrong, `fix`) for the first damaged
    file of `folder`."""
    found = first_damaged(folder)
    if found is not None:
        path, problem = found
        raise DamagedCheckpoint(f"{path} is damaged: {problem}. Nothing was changed; {fix}")


__all__ = ["DamagedCheckpoint", "check_folder", "damage", "first_damaged"]
