"""Logging helpers shared by every layer."""

from __future__ import annotations

import logging

_warned: set[str] = set()


def warn_once(key: str, message: str, logger: logging.Logger | None = None) -> None:
    """Log `message` as a warning the first time `key` is seen in this process."""
    if key not in _warned:
        _warned.add(key)
        (logger or logging.getLogger("grpo_plugin")).warning(message)
