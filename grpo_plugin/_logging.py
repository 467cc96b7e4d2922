"""Logging helpers shared by every layer."""

from __future__ import annotations

import logging
import sys

_warned: set[str] = set()


def warn_once(key: str, message: str, logger: logging.Logger | None = None) -> None:
    """Log `message` as a warning the first time `key` is seen in this process."""
    if key not in _warned:
        _warned.add(key)
        (logger or logging.getLogger("grpo_plugin")).warning(message)


class CurrentStderrHandler(logging.StreamHandler):
    """A handler that writes to whatever `sys.stderr` is when a record is emitted. While a live
    progress display runs (`training/progress.py`), rich swaps `sys.stderr` for a proxy that
    prints above the live lines; a plain `StreamHandler` keeps the original stream and would
    write through them."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):  # noqa: D102
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass  # always the current sys.stderr
