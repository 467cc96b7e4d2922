"""The memory autopilot's options of `GRPOConfig` (`autopilot.py` does the work).

`auto_find_batch_size` keeps transformers' name but not its halving loop: before the first step
the autopilot probes the memory and picks a micro-batch of whole groups (or one group split
row-wise). What it cannot plan for is refused here (several processes) or when the trainer is
built (`autopilot.check_inputs`: environments, rollout_func), with one line saying what to do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .tool_fields import ToolArguments


@dataclass
class AutopilotArguments(ToolArguments):
    """`auto_find_batch_size` and the memory it may plan for."""

    auto_find_batch_size: bool = field(
        default=False,
        metadata={
            "help": "Memory autopilot: before the first step, probe the longest prompt and choose "
            "the micro-batch (whole groups, or one group split row-wise) and logprob_chunk_size "
            "that fit the memory; the rows per step and per rollout stay as configured. One "
            "process only."
        },
    )
    auto_batch_memory_gb: float | None = field(
        default=None,
        metadata={"help": "Memory the autopilot may plan for (GB). None: 0.9 x what is free."},
    )

    def __post_init__(self) -> None:
        if self.auto_batch_memory_gb is not None and not self.auto_batch_memory_gb > 0:
            raise ValueError(
                f"auto_batch_memory_gb={self.auto_batch_memory_gb} must be > 0 (GB), or None."
            )
        super().__post_init__()
        if self.auto_find_batch_size and self.world_size > 1:
            raise ValueError(
                f"auto_find_batch_size plans one process's memory, and this run has "
                f"{self.world_size}; set it False and choose per_device_train_batch_size."
            )
