"""Local data files as the dataset loader reads them: a UTF-8 byte-order mark left out, JSON
lines checked one by one (a bad line named by its number), the first record's columns."""

from __future__ import annotations

import codecs
import contextlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LOCAL_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


@contextlib.contextmanager
def without_bom(path: Path) -> Iterator[Path]:
    """`path`, or where it starts with a UTF-8 byte-order mark a copy without it (the json reader
    of datasets' declared floor refuses one)."""
    with path.open("rb") as f:
        has_bom = f.read(3) == codecs.BOM_UTF8
    if not has_bom:
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="grpo-data-") as folder:
        copy = Path(folder) / path.name
        copy.write_bytes(path.read_bytes()[3:])
        yield copy


def require_file(path: Path) -> None:
    if path.is_dir():
        raise ValueError(
            f"dataset path {str(path)!r} is a folder; give a {'/'.join(LOCAL_SUFFIXES)} file"
        )
    if not path.is_file():
        raise ValueError(f"dataset file {str(path)!r} does not exist; fix the path")


def _json_record(path: Path, number: int, line: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{path}:{number}: not valid JSON ({err.msg} at column {err.colno}); fix or delete "
            "that line."
        ) from None
    if not isinstance(record, dict):
        raise ValueError(
            f"{path}:{number}: a record must be a JSON object ({{...}}), got "
            f"{type(record).__name__}."
        )
    return record


def check_json_lines(path: Path) -> None:
    """Every non-blank line of a .jsonl file is a JSON object; the first bad one is named."""
    try:
        with path.open(encoding="utf-8-sig") as f:  # a byte-order mark is not part of line 1
            for number, line in enumerate(f, 1):
                if line.strip():
                    _json_record(path, number, line)
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}).") from None


def first_record_columns(path: Path) -> list[str] | None:
    """Column names from the first record of a local file (None when not cheap to tell)."""
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        with path.open(encoding="utf-8-sig", errors="replace") as f:
            line = f.readline().strip()
        return list(_json_record(path, 1, line)) if line else []
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    if suffix == ".csv":
        with path.open(encoding="utf-8-sig", errors="replace") as f:
            return [c.strip() for c in f.readline().split(",")]
    return None
