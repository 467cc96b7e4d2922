"""Logging and terminal-output helpers shared by every layer."""

from __future__ import annotations

import logging
import sys

_warned: set[str] = set()

# Characters a terminal acts on instead of showing: C0 controls but tab and newline (ESC starts
# the escape sequences that retitle a window, clear the screen or, OSC 52, write the clipboard;
# CR overwrites a line), DEL, the C1 controls (0x9b is a one-byte CSI), and the bidirectional
# overrides that reorder what a reader sees ("Trojan Source", arXiv:2111.00169).
_ACTED_ON = [*range(0x09), *range(0x0B, 0x20), 0x7F, *range(0x80, 0xA0)]
_ACTED_ON += [0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_VISIBLE = {cp: (f"\\x{cp:02x}" if cp < 0x100 else f"\\u{cp:04x}") for cp in _ACTED_ON}


def visible(text: str) -> str:
    """`text` (from a dataset, a model or a user's code) safe to print to a terminal: every
    character the terminal would act on is written as its escape (`\\x1b`); tabs and newlines
    are kept."""
    return text.translate(_VISIBLE)


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

    def format(self, record: logging.LogRecord) -> str:  # noqa: D102
        return visible(super().format(record))  # a message may quote a prompt or a completion
