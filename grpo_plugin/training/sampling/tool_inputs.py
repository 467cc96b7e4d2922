"""TRL's `tools=`, `environment_factory=` and `rollout_func=`, checked before any model loads.

`ToolInputs.check` resolves the tools (callables, the built-in `"python"`, or
`"module:function"` / `"file.py:function"` names, as rewards are named), builds every schema
and probes one instance of each environment, so a tool without type hints or docstring, a
duplicate name or an environment without `reset` fails at once with one line. The chat
template is checked against the tokenizer (`setup`) once it is loaded, before training starts.
A `rollout_func` runs its own loop, so it is refused together with tools or environments; given
the config, what overlapped scoring cannot run on is refused too (`overlap.check_inputs`; what
the memory autopilot cannot plan for: `autopilot.check_inputs`, called by the trainer).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reward_fns import reward_name

from ...rollout.chat_tools import resolve_tool_format
from ...rollout.environments import EMPTY_PROMPT, Environments
from ...rollout.multiturn import ToolSetup
from ...rollout.tool_calls import Tool, toolbox
from ...scoring.calls import worker_targets
from ...user_code import worker as isolation
from ...user_code.callables import load_callable
from . import overlap
from .streaming import stream_columns

logger = logging.getLogger(__name__)


def builtin_tools() -> dict[str, Callable[..., Any]]:
    """Tools known by name: `python` (code in the `code_tests` sandbox)."""
    from .python_tool import python

    return {"python": python}


def resolve_tool(spec: Any, base_dir: str | Path | None = None) -> Callable[..., Any]:
    """A callable as it is; a built-in tool's name; or a 'module:function' / 'file.py:function'."""
    if callable(spec):
        return spec
    builtins = builtin_tools()
    if isinstance(spec, str) and spec in builtins:
        return builtins[spec]
    if isinstance(spec, str) and ":" not in spec:
        raise ValueError(
            f"tool {spec!r} is not a built-in tool ({', '.join(builtins)}) nor a "
            "'module:function' path"
        )
    return load_callable(spec, "tool", base_dir)


def resolve_tools(specs: Sequence[Any] | None, base_dir: str | Path | None = None) -> list[Tool]:
    """Every entry as a `Tool` with its schema (ValueError naming the one that fails)."""
    if specs is None:
        return []
    if isinstance(specs, (str, bytes)) or callable(specs):
        raise ValueError("tools must be a list of tools, e.g. tools=[multiply]")
    tools = [Tool.of(resolve_tool(spec, base_dir)) for spec in specs]
    toolbox(tools)  # two tools with one name: refused now
    return tools


def _check_static_decode(args: Any, inputs: Any) -> None:
    """The static decode loop (`cache_implementation='static'`, `compile_decode`) runs single
    turns only: refused, before anything loads, next to tools, environments or a rollout_func."""
    if not (args.cache_implementation == "static" or args.compile_decode):
        return
    setting = "compile_decode=True" if args.compile_decode else "cache_implementation='static'"
    if inputs.rollout_func is not None:
        source = "a rollout_func (it generates by itself)"
    elif inputs.tools or inputs.environments is not None:
        source = "tools (the tool loop appends results of unknown length to the cache)"
    else:
        return
    raise ValueError(f"{setting} is for single-turn rollouts, not {source}; leave it off.")


@dataclass
class ToolInputs:
    """The run's tools, environments and rollout function, resolved."""

    tools: list[Tool]
    environments: Environments | None
    rollout_func: Callable[..., dict[str, Any]] | None

    @classmethod
    def check(
        cls, tools: Any, rollout_func: Any, environment_factory: Any, args: Any = None
    ) -> ToolInputs:
        if rollout_func is not None and not callable(rollout_func):
            raise ValueError("rollout_func must be a callable (prompts, trainer) -> dict")
        if rollout_func is not None and (tools or environment_factory is not None):
            raise ValueError(
                "rollout_func runs its own generation loop, so tools= and environment_factory= "
                "would not be used; call your tools inside rollout_func, or drop rollout_func"
            )
        resolved = resolve_tools(tools)
        environments = None if environment_factory is None else Environments(environment_factory)
        if environments is not None:
            for instance in (pool[0] for pool in environments.pool.values()):
                toolbox(resolved + environments.tools_of(instance))
        inputs = cls(resolved, environments, rollout_func)
        if args is not None:
            overlap.check_inputs(args, inputs)  # overlap_scoring: single-turn rollouts only
        if args is not None:
            _check_static_decode(args, inputs)
        copy = args is not None and args.rollout_precision not in (None, "policy")
        if copy and rollout_func is not None:
            raise ValueError(
                f"rollout_precision={args.rollout_precision!r} with a rollout_func: the function "
                "samples the rollout itself; use rollout_precision='policy'"
            )
        return inputs

    def check_dataset(self, dataset: Any) -> None:
        """Tools need chat prompts; with a dict of environments every row must name one
        (map-style datasets: checked now, streamed ones at their first rollout)."""
        if dataset is None:
            return
        columns = getattr(dataset, "column_names", None) or stream_columns(dataset)
        if "prompt" not in columns and self.environments is None:
            raise ValueError(
                f"train_dataset has no 'prompt' column (columns: {columns}); only an "
                "environment_factory's reset() can supply the prompts. Rename the column holding "
                "the prompts, e.g. dataset.rename_column('question', 'prompt')."
            )
        if not self.uses_tools or not hasattr(dataset, "unique"):
            return
        if len(dataset) and "prompt" in columns and not isinstance(dataset[0]["prompt"], list):
            raise ValueError(
                "tools need chat prompts (lists of {'role', 'content'} messages); the dataset's "
                "prompts are plain text: wrap each as [{'role': 'user', 'content': prompt}]"
            )
        env = self.environments
        if env is None or not env.by_column:
            return
        if "environment" not in dataset.column_names:
            raise ValueError(
                "environment_factory is a dict, so each row picks its environment by name: add "
                f"an `environment` column with one of {sorted(map(str, env.factories))}"
            )
        env.names([{"environment": name} for name in dataset.unique("environment")])

    def owned_data(self, dataset: Any, args: Any) -> Any:
        """`dataset`, or (None, with one environment_factory) TRL's placeholder: rows of one
        empty user message, one rollout's worth, cycled for `max_steps`; each `reset()` then
        supplies the prompt. Without a dataset, a dict of factories or no `max_steps` is refused."""
        if dataset is not None:
            return dataset
        if self.environments is None:
            raise ValueError(
                "`train_dataset` is required unless an `environment_factory` is provided (its "
                "reset() then supplies the prompts)."
            )
        if self.environments.by_column:
            raise ValueError(
                "a dict environment_factory requires a `train_dataset` with an `environment` "
                "column (each row is routed by it); give one, or a single factory."
            )
        if args.max_steps is None or args.max_steps <= 0:
            raise ValueError(
                "without a train_dataset the environment owns the data (reset() returns the "
                "prompt), so the run has no length: set max_steps, e.g. GRPOConfig(max_steps=100)."
            )
        from datasets import Dataset

        return Dataset.from_dict({"prompt": [list(EMPTY_PROMPT)] * args.prompts_per_generation})

    def worker_tools(self, isolate: bool) -> list[Tool]:
        """The tools that run in the worker process (for `isolation.prepare`)."""
        return [t for t in self.tools if isolate and not t.in_process]

    def public_tools(self) -> list[Callable[..., Any]]:
        """`trainer.tools` as TRL exposes it: the user's tools, then each environment class's tool
        methods (bound to its first instance; not `reset` nor `get_reward`), once per name."""
        found = {t.name: t.fn for t in self.tools}
        if self.environments is not None:
            for pool in self.environments.pool.values():
                for tool in self.environments.tools_of(pool[0]):
                    found.setdefault(tool.name, tool.fn)
        return list(found.values())

    @property
    def uses_tools(self) -> bool:
        return bool(self.tools) or self.environments is not None

    def reward_functions(self) -> list[Callable[..., list[float | None]]]:
        """The environments' `get_reward`s as rewards (TRL: named after the class, weight 1)."""
        return [] if self.environments is None else self.environments.reward_functions()

    def setup(self, tokenizer: Any, args: Any) -> ToolSetup | None:
        """The multi-turn loop's setup for this tokenizer (None without tools): the chat template
        is resolved and a call is rendered and read back now (ValueError with the fix)."""
        if not self.uses_tools:
            return None
        return ToolSetup(
            format=resolve_tool_format(tokenizer, args.tool_chat_template),
            tools=self.tools,
            environments=self.environments,
            max_iterations=args.max_tool_calling_iterations,
            timeout=args.tool_timeout,
            max_result_chars=args.max_tool_result_length,
            template_kwargs=getattr(args, "chat_template_kwargs", None),
            isolate=getattr(args, "isolate_user_code", True),  # `grpo-plugin eval`: its own args
        )


def fork_user_code_worker(rewards: Any, tools: ToolInputs, args: Any) -> None:
    """Fork the worker process for the run's rewards (`RewardSources`) and tools now
    (`user_code/worker.py`): the trainer calls it before the model loads, so the fork holds
    little memory."""
    # with environments, every reward reads them here (`calls.in_worker`)
    targets = [] if tools.environments else worker_targets(rewards.funcs, rewards.checks)
    targets += tools.worker_tools(args.isolate_user_code)
    if targets and isolation.supported():
        isolation.shared_worker().prepare(targets)
        names = ", ".join(getattr(t, "name", None) or reward_name(t) for t in targets)
        logger.info(
            "In a worker process (isolate_user_code): %s. A time limit can stop any call there; "
            "the code keeps its own memory (docs/rewards.md, 'Where your code runs').",
            names,
        )
