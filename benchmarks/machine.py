"""What every benchmark report names: the CPU it ran on (imported by the scripts beside it)."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name and the flags that change our kernels' speed (AVX512-BF16, AMX)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    if "model name" not in info:
        return platform.machine()
    name = info.split("model name", 1)[1].split(":", 1)[1].split("\n", 1)[0].strip()
    flags = [f for f in ("avx512_bf16", "amx_bf16") if f" {f}" in info]
    return " ".join([name, *flags])
