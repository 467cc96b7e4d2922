"""How many CPU threads torch trains with (`GRPOConfig.torch_threads`; the CLI's recipes: "auto").

Why: torch splits each operation over its threads, which meet at a barrier before the next one.
On a 2-core machine with one busy process beside the run, one of our two threads waits for the
busy core at every barrier, and both wait with it: the demo ran far slower than losing one
core explains, and `auto`, which took 1 thread, most of that back (`python
benchmarks/busy_machine.py`; docs/benchmarks.md, "A busy machine").

    None    the process's setting, untouched (torch's default: one thread per core, or
            OMP_NUM_THREADS): what TRL does
    "auto"  the cores that are free when the trainer is built: the CPU time /proc/stat counts as
            idle over 0.3 s, on the cores this process may run on, rounded; never more
            than the process's setting; an OMP_NUM_THREADS the user set is kept, and so is
            the count of each process of a multi-process launch
    N       N threads

Results depend on the thread count (a sum split over two threads adds in another order: the
demo's log-probabilities differ in the last bits between 1 and 2 threads), so the count a run
trains with is recorded in its checkpoints (grpo_resume.json, `torch_threads`) and a resume
takes it back whatever the load is then; a count set explicitly that differs from it is warned
about, since that resume is no longer bit-exact. A load that starts after the trainer is built
is not followed, for the same reason.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

SAMPLE_SECONDS = 0.3
RECORD_KEY = "torch_threads"


def _cpu_times(allowed: set[int], stat: Path) -> tuple[float, float]:
    """(idle, total) jiffies summed over the allowed CPUs' lines of /proc/stat."""
    idle = total = 0.0
    for line in stat.read_text().splitlines():
        name, *values = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in allowed:
            continue
        numbers = [float(v) for v in values[:8]]  # user nice system idle iowait irq softirq steal
        idle += numbers[3] + numbers[4]
        total += sum(numbers)
    return idle, total


def free_cores(seconds: float = SAMPLE_SECONDS, stat: Path = Path("/proc/stat")) -> float | None:
    """How many of this process's CPUs were idle over `seconds` (a VM's stolen time counts as
    busy); None where /proc/stat cannot be read."""
    if not hasattr(os, "sched_getaffinity"):  # not Linux: no /proc/stat either
        return None
    allowed = os.sched_getaffinity(0)
    try:
        idle0, total0 = _cpu_times(allowed, stat)
        time.sleep(seconds)
        idle1, total1 = _cpu_times(allowed, stat)
    except (OSError, ValueError, IndexError):
        return None
    if total1 <= total0:
        return None
    return len(allowed) * (idle1 - idle0) / (total1 - total0)


def auto_threads(current: int, free: float | None) -> int:
    """The thread count for `free` idle cores: rounded, at least 1, at most `current`."""
    if free is None:
        return current
    return max(1, min(current, int(free + 0.5)))


def _follows_load(setting: int | str | None, processes: int) -> bool:
    """Whether the count comes from the load: `auto`, with no OMP_NUM_THREADS the user set and
    one process (in a multi-process launch each would count the others' load)."""
    return setting == "auto" and not os.environ.get("OMP_NUM_THREADS") and processes == 1


def choose(setting: int | str | None, processes: int = 1) -> tuple[int, str] | None:
    """(threads, why) for a run's `torch_threads`; None: leave the process as it is."""
    if setting is None:
        return None
    current = torch.get_num_threads()
    if setting != "auto":
        return int(setting), "torch_threads"
    if not _follows_load(setting, processes):
        if os.environ.get("OMP_NUM_THREADS"):
            return current, "auto keeps OMP_NUM_THREADS"
        return current, f"auto keeps each of {processes} processes' own"
    free = free_cores()
    threads = auto_threads(current, free)
    seen = "unknown" if free is None else f"{free:.1f} of {len(os.sched_getaffinity(0))}"
    return threads, f"auto: {seen} cores free"


def apply(args: Any) -> None:
    """When the trainer is built: set torch's thread count for `args.torch_threads` and say so."""
    chosen = choose(args.torch_threads, args.world_size)
    if chosen is None:
        return
    threads, why = chosen
    if threads != torch.get_num_threads():
        torch.set_num_threads(threads)
    logger.info("torch threads: %d (%s)", threads, why)


def record(saved: dict[str, Any]) -> dict[str, Any]:
    """The run's record with the thread count it trains with."""
    return saved | {RECORD_KEY: torch.get_num_threads()}


def restore(saved: dict[str, Any] | None, args: Any, checkpoint: str) -> None:
    """On resume: take back the checkpoint's thread count where the load chose this one;
    a count set otherwise is kept, with a warning that the resume is not bit-exact."""
    recorded = (saved or {}).get(RECORD_KEY)
    current = torch.get_num_threads()
    if recorded is None or recorded == current:
        return
    if not _follows_load(args.torch_threads, args.world_size):
        logger.warning(
            "%s trained with %d torch threads; this resume runs %d, so its results differ from "
            "an uninterrupted run's in the last bits (set torch_threads: %d, or auto, to match).",
            checkpoint,
            recorded,
            current,
            recorded,
        )
        return
    torch.set_num_threads(int(recorded))
    logger.info(
        "torch threads: %d, as %s trained with (auto: a resume keeps its run's count)",
        recorded,
        checkpoint,
    )
