"""TRL's `environment_factory`: stateful tools, one environment instance per rollout.

`environment_factory` is a callable returning an environment, or `{name: callable}` where each
dataset row's `environment` column picks one. An environment's public methods are its tools
(schemas from their type hints and docstrings); `reset(**row)` starts a rollout and may return
text appended to the last user message; an optional `get_reward()` scores the finished rollout
and becomes one more reward, named after the class, with weight 1 (rollouts of other
environments get None from it). As in TRL, instances are pooled and reused across rollouts:
one is probed per factory when the trainer is built, more are made only when one rollout needs
more of them at once.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from .tool_calls import Tool

SPECIAL_METHODS = ("reset", "get_reward")
# The prompt of a row that has none (the environment owns the data): reset() supplies the text.
EMPTY_PROMPT = ({"role": "user", "content": ""},)


def _methods(environment: Any) -> dict[str, Any]:
    """Public functions of the environment's class (listed on the class: properties stay unread)."""
    return {
        name: getattr(environment, name)
        for name, _ in inspect.getmembers(type(environment), predicate=inspect.isfunction)
        if not name.startswith("_")
    }


class Environments:
    """The factories of a run, their probed tools and the pool of live instances."""

    def __init__(self, factory: Callable[[], Any] | dict[str, Callable[[], Any]]):
        self.by_column = isinstance(factory, dict)
        self.factories = dict(factory) if self.by_column else {None: factory}
        if not self.factories:
            raise ValueError("environment_factory is an empty dict; give at least one factory")
        self.pool: dict[Any, list[Any]] = {}
        self._schemas: dict[tuple[type, str], dict[str, Any]] = {}
        self.reward_types: list[type] = []  # classes with get_reward, in factory order
        for name, make in self.factories.items():
            if not callable(make):
                raise ValueError(f"environment_factory[{name!r}] is not callable")
            instance = make()
            methods = _methods(instance)
            if "reset" not in methods:
                raise ValueError(
                    f"the environment {type(instance).__name__} has no reset() method; add "
                    "reset(self, **row) (it may return text to append to the prompt)"
                )
            self.tools_of(instance)  # schemas checked now
            self.pool[name] = [instance]
            if "get_reward" in methods and type(instance) not in self.reward_types:
                self.reward_types.append(type(instance))

    def tools_of(self, environment: Any) -> list[Tool]:
        """The environment's tools, bound to it (schemas built once per class)."""
        tools = []
        for name, method in _methods(environment).items():
            if name in SPECIAL_METHODS:
                continue
            key = (type(environment), name)
            if key not in self._schemas:
                self._schemas[key] = Tool.of(method).schema
            # in the trainer's process: the instance's state is the trainer's (see tools.py)
            tools.append(Tool(name, method, self._schemas[key], in_process=True))
        return tools

    def names(self, rows: list[dict[str, Any]]) -> list[Any]:
        """Each row's environment name (None for a single factory)."""
        if not self.by_column:
            return [None] * len(rows)
        names = [row.get("environment") for row in rows]
        unknown = sorted({str(n) for n in names if n not in self.factories})
        if unknown:
            raise ValueError(
                f"rows name environment(s) {unknown}, not among the environments of "
                f"environment_factory {sorted(map(str, self.factories))}; fix the dataset's "
                "`environment` column"
            )
        return names

    def checkout(self, rows: list[dict[str, Any]]) -> list[Any]:
        """One instance per row, distinct within the call (`reset` is the caller's to do)."""
        handed: dict[Any, int] = {}
        instances = []
        for name in self.names(rows):
            pool, index = self.pool[name], handed.get(name, 0)
            if index == len(pool):
                pool.append(self.factories[name]())
            handed[name] = index + 1
            instances.append(pool[index])
        return instances

    @staticmethod
    def reset(instance: Any, row: dict[str, Any], by_column: bool) -> str | None:
        kwargs = {k: v for k, v in row.items() if not (by_column and k == "environment")}
        observation = instance.reset(**kwargs)
        if observation is not None and not isinstance(observation, str):
            raise TypeError(
                f"{type(instance).__name__}.reset() returned {type(observation).__name__}; "
                "return None or the text to append to the last user message"
            )
        return observation

    def reward_functions(self) -> list[Callable[..., list[float | None]]]:
        """One reward per environment class with `get_reward` (TRL's `environments` kwarg)."""
        return [_environment_reward(cls) for cls in self.reward_types]


def _environment_reward(env_type: type) -> Callable[..., list[float | None]]:
    if inspect.iscoroutinefunction(env_type.get_reward):

        async def reward(environments, **kwargs):
            return [await e.get_reward() if type(e) is env_type else None for e in environments]

    else:

        def reward(environments, **kwargs):
            return [e.get_reward() if type(e) is env_type else None for e in environments]

    reward.__name__ = env_type.__name__
    reward.__qualname__ = env_type.__name__
    reward.runs_in_process = True  # the environments live in the trainer's process
    return reward


def with_observation(prompt: list[dict[str, Any]], observation: str | None) -> list[dict[str, Any]]:
    """The prompt with `observation` appended to its last message (a new list; input untouched)."""
    if observation is None:
        return prompt
    last = prompt[-1]
    return [*prompt[:-1], {**last, "content": f"{last.get('content') or ''}{observation}"}]
