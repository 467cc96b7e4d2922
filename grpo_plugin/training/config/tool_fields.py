"""The tool-calling options of `GRPOConfig`: TRL's `max_tool_calling_iterations` and our own.

The tools themselves are given to the trainer (`GRPOTrainer(tools=[...])`, as in TRL, or
`tools: [...]` in a recipe); these fields say how the multi-turn loop (`rollout/multiturn.py`)
runs them. They do nothing without tools.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...rollout.chat_tools import TOOL_TEMPLATES
from .trl_fields import TRLArguments


def _help(text: str, default: Any = None) -> Any:
    return field(default=default, metadata={"help": text})


@dataclass
class ToolArguments(TRLArguments):
    """How tool calls run; see `rollout/multiturn.py`."""

    max_tool_calling_iterations: int | None = _help(
        "Rounds of tool calls per completion (TRL's): after each round the results are appended "
        "and the completions that called a tool go on. None: until no completion calls one "
        "(max_completion_length still bounds the whole exchange)."
    )
    tool_timeout: float = _help(
        "Seconds one round of tool calls may take; a call still running then returns a timeout "
        "error to the model (the run goes on).",
        10.0,
    )
    max_tool_result_length: int = _help(
        "Characters of a tool's result that the model reads; a longer result is cut, with a note "
        "saying how much was left out.",
        1000,
    )
    tool_chat_template: str = _help(
        "How tools, calls and results are written in the prompt: 'chatml' (ours, for ChatML "
        "models such as SmolLM2 and Qwen2.5: <tool_call>{...}</tool_call> and tool turns), "
        "'model' (the tokenizer's own template, which must render tools), or 'auto' (the "
        "tokenizer's when it renders tools, else 'chatml' for a ChatML template).",
        "auto",
    )

    def __post_init__(self) -> None:
        if self.max_tool_calling_iterations is not None and self.max_tool_calling_iterations < 0:
            raise ValueError(
                f"max_tool_calling_iterations={self.max_tool_calling_iterations} must be >= 0 "
                "(0: tools are shown but never run) or None (no limit)."
            )
        if not self.tool_timeout > 0:
            raise ValueError(f"tool_timeout={self.tool_timeout} must be > 0 seconds.")
        if self.max_tool_result_length < 1:
            raise ValueError(f"max_tool_result_length={self.max_tool_result_length} must be >= 1.")
        if self.tool_chat_template not in TOOL_TEMPLATES:
            raise ValueError(
                f"tool_chat_template={self.tool_chat_template!r}; use one of "
                f"{', '.join(TOOL_TEMPLATES)}."
            )
        super().__post_init__()
