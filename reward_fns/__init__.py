"""reward_fns: a reward registry that third-party packages can plug into, plus verifiers.

Rewards follow TRL's contract ``fn(prompts, completions, completion_ids=None, **columns)
-> list[float | None]``. Look one up with :func:`get` (registered name, ``module:function``
path, or an entry point in the group ``grpo_plugin.rewards``); list them with
:func:`available` or ``python -m reward_fns``. Built-ins: ``exact_integer``, ``last_integer``,
``gsm8k``, ``math``, ``think_format``, ``soft_overlong``, ``code_tests``.

This package never imports ``grpo_plugin``: third parties may depend on it alone.
"""

from reward_fns import answers, code, format, math  # noqa: F401  (registers the built-ins)
from reward_fns.registry import (
    ENTRY_POINT_GROUP,
    DuplicateRewardError,
    UnknownRewardError,
    available,
    call_reward,
    completion_text,
    configure,
    format_registry,
    get,
    in_process,
    is_async_reward,
    register,
    resolve,
    reward_name,
    runs_in_process,
    unregister,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "DuplicateRewardError",
    "UnknownRewardError",
    "available",
    "call_reward",
    "completion_text",
    "configure",
    "format_registry",
    "get",
    "in_process",
    "is_async_reward",
    "register",
    "resolve",
    "reward_name",
    "runs_in_process",
    "unregister",
]
