"""Whether the Hugging Face Hub can be reached, asked before a model or dataset is fetched from it.

Without this, a Hub id on a machine without network ended in a traceback after a minute:
huggingface_hub retries a failed name lookup five times (1 + 2 + 4 + 8 + 8 s) per file, and
`datasets` raises `ConnectionError` at the end. `unreachable_reason` answers at once: the Hub is
offline by choice (`HF_HUB_OFFLINE=1`, or `HF_DATASETS_OFFLINE=1` for datasets), or its host
name does not resolve (no network). Behind a proxy the name need not resolve here, so it is not
looked up then.
"""

from __future__ import annotations

import os
import socket
from functools import cache
from urllib.parse import urlparse

_TRUE = ("1", "ON", "YES", "TRUE")
_PROXIES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def offline(datasets: bool = False) -> str | None:
    """The variable that puts the Hub offline (`HF_HUB_OFFLINE`, and for `datasets` also
    `HF_DATASETS_OFFLINE`), or None."""
    names = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE") if datasets else ("HF_HUB_OFFLINE",)
    return next((n for n in names if os.environ.get(n, "").upper() in _TRUE), None)


@cache
def _unresolved_host() -> str | None:
    """The Hub's host name when it does not resolve here (looked up once per process)."""
    if any(os.environ.get(name) for name in _PROXIES):
        return None
    from huggingface_hub import constants

    host = urlparse(constants.ENDPOINT).hostname
    if not host:
        return None
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return host
    return None


def unreachable_reason(datasets: bool = False) -> str | None:
    """Why the Hub cannot be reached ("the Hub is offline (HF_HUB_OFFLINE=1)", "the Hub cannot
    be reached (huggingface.co does not resolve: no network?)"), or None when it may be."""
    variable = offline(datasets)
    if variable:
        return f"the Hub is offline ({variable}=1)"
    host = _unresolved_host()
    if host:
        return f"the Hub cannot be reached ({host} does not resolve: no network?)"
    return None
