"""Reward registry: register, look up and call reward functions by name.

A reward follows TRL's contract ``fn(prompts, completions, completion_ids=None, **columns)
-> list[float | None]``; ``None`` means "cannot score this one". Both ``def`` and ``async def``
rewards are allowed; the registry never wraps an async reward into a sync one, so a trainer can
await many of them concurrently. :func:`call_reward` runs either kind from sync code.

A name resolves in this order (``get``):

1. a name registered with :func:`register`;
2. a ``module:function`` or dotted ``module.function`` path;
3. an entry point in the group ``grpo_plugin.rewards`` of any installed distribution, so a
   pip-installed package adds rewards with no change here (TRL, open-r1 and verl have no
   equivalent).

Departure from TRL: TRL takes callables or a fixed table of names; here parameterised rewards
come back as a ``functools.partial`` whose ``__name__`` is kept, since metrics are named
``rewards/<__name__>/mean``.
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import importlib
import inspect
import threading
from collections.abc import Callable
from importlib import metadata
from typing import Any

ENTRY_POINT_GROUP = "grpo_plugin.rewards"
RewardFn = Callable[..., Any]

_REGISTRY: dict[str, RewardFn] = {}
_LOCK = threading.Lock()


class UnknownRewardError(KeyError, ValueError):
    """A reward name that is neither registered, importable, nor an entry point."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class DuplicateRewardError(ValueError):
    """A reward name registered twice without ``override=True``."""


def register(
    name: str | RewardFn | None = None, fn: RewardFn | None = None, *, override: bool = False
) -> Any:
    """Register a reward under ``name``.

    Usable as ``@register``, ``@register("name")``, or ``register("name", fn)``.
    Registering a taken name raises :class:`DuplicateRewardError` unless ``override=True``.
    """
    if callable(name) and fn is None:  # bare @register
        return _add(name.__name__, name, override)
    if fn is not None:
        return _add(_check_name(name), fn, override)

    def decorator(func: RewardFn) -> RewardFn:
        return _add(_check_name(name) if name is not None else func.__name__, func, override)

    return decorator


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name.strip():
        raise TypeError(f"reward name must be a non-empty string, got {name!r}")
    return name


def _add(name: str, fn: RewardFn, override: bool) -> RewardFn:
    if not callable(fn):
        raise TypeError(f"reward {name!r} must be callable, got {type(fn).__name__}")
    with _LOCK:
        if name in _REGISTRY and _REGISTRY[name] is not fn and not override:
            raise DuplicateRewardError(
                f"reward {name!r} is already registered (by {_describe(_REGISTRY[name])}); "
                "pick another name or pass override=True"
            )
        _REGISTRY[name] = fn
    return fn


def unregister(name: str) -> None:
    """Remove a registered name (mostly for tests); unknown names are ignored."""
    with _LOCK:
        _REGISTRY.pop(name, None)


def _describe(fn: RewardFn) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _entry_points() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _import_path(path: str) -> RewardFn | None:
    """Import ``pkg.mod:func`` or ``pkg.mod.func``; None when the module is not importable."""
    if ":" in path:
        module_name, _, attr = path.partition(":")
    else:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        return None
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and module_name.startswith(err.name):
            return None  # the path itself is not importable; a failing inner import re-raises
        raise
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UnknownRewardError(f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{path!r} is a {type(obj).__name__}, not a callable reward")
    return obj


def _lookup(name: str) -> RewardFn:
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" in name or "." in name:
        found = _import_path(name)
        if found is not None:
            return found
    eps = _entry_points()
    if name in eps:
        return eps[name].load()
    known = sorted(set(_REGISTRY) | set(eps))
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise UnknownRewardError(
        f"unknown reward {name!r}.{hint} Known rewards: {', '.join(known)}. "
        "A 'module:function' path or an entry point in the group "
        f"{ENTRY_POINT_GROUP!r} also works."
    )


def reward_name(fn: RewardFn) -> str:
    """The one name of a reward in metrics, logs and cards: ``__name__``, a partial's wrapped
    function's name, or the class name of a callable object."""
    name = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", None)
    return name or type(fn).__name__


def configure(fn: RewardFn, name: str | None = None, **params: Any) -> RewardFn:
    """Bind keyword ``params`` to ``fn``; the result keeps ``fn``'s ``__name__``.

    Unknown parameter names raise ``TypeError`` listing the accepted ones.
    """
    if not params:
        return fn
    _check_params(fn, params)
    bound = functools.partial(fn, **params)
    bound.__name__ = name or reward_name(fn)  # type: ignore[attr-defined]
    bound.__doc__ = fn.__doc__
    bound.__module__ = getattr(fn, "__module__", None)  # type: ignore[attr-defined]
    bound.__dict__.update(getattr(fn, "__dict__", {}))  # e.g. `required_columns`
    return bound


def _check_params(fn: RewardFn, params: dict[str, Any]) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins without a signature: let the call fail
    kinds = {p.name: p.kind for p in sig.parameters.values()}
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    named = {n for n, k in kinds.items() if k not in variadic}
    has_kw_only = inspect.Parameter.KEYWORD_ONLY in kinds.values()
    if inspect.Parameter.VAR_KEYWORD in kinds.values() and not has_kw_only:
        return  # a plain **kwargs reward accepts anything
    unknown = sorted(set(params) - named)
    if unknown:
        raise TypeError(
            f"reward {reward_name(fn)!r} has no parameter(s) {unknown}; it accepts: {sorted(named)}"
        )


def get(name: str, **params: Any) -> RewardFn:
    """Return the reward called ``name``, configured with ``params`` when given."""
    if not isinstance(name, str):
        raise TypeError(f"reward name must be a string, got {type(name).__name__}; use resolve()")
    fn = _lookup(name.strip())
    return configure(fn, **params)


def resolve(name_or_callable: str | RewardFn, **params: Any) -> RewardFn:
    """Like :func:`get`, but a callable is accepted too (returned as is, or configured)."""
    if callable(name_or_callable):
        return configure(name_or_callable, **params)
    return get(name_or_callable, **params)


def _first_doc_line(fn: RewardFn) -> str:
    doc = inspect.getdoc(fn) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def available() -> dict[str, str]:
    """Registered rewards and entry-point rewards, name -> one-line description."""
    table = {name: _first_doc_line(fn) for name, fn in sorted(_REGISTRY.items())}
    for name, ep in sorted(_entry_points().items()):
        table.setdefault(name, f"(entry point {ep.value})")
    return table


def format_registry() -> str:
    """The registry as a two-column text table (what ``python -m reward_fns`` prints)."""
    table = available()
    width = max((len(n) for n in table), default=4)
    lines = [f"{'name'.ljust(width)}  description", f"{'-' * width}  {'-' * 11}"]
    lines += [f"{name.ljust(width)}  {doc}" for name, doc in table.items()]
    lines.append("")
    lines.append(
        "Also accepted: 'module:function' paths and entry points in the group "
        f"{ENTRY_POINT_GROUP!r}."
    )
    return "\n".join(lines)


def in_process(fn: RewardFn) -> RewardFn:
    """Mark ``fn`` as safe to call inside the trainer's own process, where no time limit can stop
    a call stuck in C code. Only for rewards that always return promptly (no regular expression
    that can backtrack without bound, no network or disk wait without a timeout) or that bound
    themselves (their own killable process), and for rewards that must share the trainer's memory
    (a model on its GPU). Unmarked rewards run in a worker process that a time limit can kill."""
    fn.runs_in_process = True  # type: ignore[attr-defined]
    return fn


def runs_in_process(fn: RewardFn) -> bool:
    """Whether ``fn`` (or the function a partial wraps) was marked with :func:`in_process`."""
    while isinstance(fn, functools.partial) and not hasattr(fn, "runs_in_process"):
        fn = fn.func
    return bool(getattr(fn, "runs_in_process", False))


def is_async_reward(fn: RewardFn) -> bool:
    """True for ``async def`` rewards (partials and async ``__call__`` included)."""
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - objects with an async __call__
    return call is not None and inspect.iscoroutinefunction(call)


def call_reward(fn: RewardFn, **kwargs: Any) -> list[float | None]:
    """Call a sync or async reward from sync code and check its output.

    Works from any thread; when an event loop is already running in this thread the coroutine
    runs on a fresh loop in a worker thread.
    """
    result = fn(**kwargs)
    if inspect.isawaitable(result):
        result = run_awaitable(result)
    expected = len(kwargs["completions"]) if "completions" in kwargs else None
    return check_rewards(result, expected, reward_name(fn))


def run_awaitable(awaitable: Any) -> Any:
    """Run an awaitable to completion from sync code, even inside a running event loop."""

    async def wrap() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wrap())
    box: dict[str, Any] = {}

    def runner() -> None:
        try:
            box["value"] = asyncio.run(wrap())
        except BaseException as err:  # re-raised in the caller's thread
            box["error"] = err

    worker = threading.Thread(target=runner, name="reward_fns-call_reward")
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def check_rewards(values: Any, expected: int | None, name: str) -> list[float | None]:
    """Validate a reward's output: a list of float-or-None, ``expected`` long."""
    if not isinstance(values, list | tuple):
        raise TypeError(f"reward {name!r} must return a list, got {type(values).__name__}")
    if expected is not None and len(values) != expected:
        raise ValueError(
            f"reward {name!r} returned {len(values)} values for {expected} completions"
        )
    out: list[float | None] = []
    for v in values:
        if v is None:
            out.append(None)
        elif isinstance(v, int | float):
            out.append(float(v))
        else:
            raise TypeError(f"reward {name!r} returned {v!r}; expected a float or None")
    return out


def completion_text(completion: Any) -> str:
    """The text to score: a string as is, or the content of the last assistant message.

    Chat completions are lists of ``{"role", "content"}`` messages; ``content`` may also be a
    list of parts (``{"type": "text", "text": ...}``). With no assistant message the last
    message is used.
    """
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return _content_text(completion.get("content"))
    messages = list(completion)
    if not messages:
        return ""
    assistant = [m for m in messages if isinstance(m, dict) and m.get("role") == "assistant"]
    last = assistant[-1] if assistant else messages[-1]
    return _content_text(last.get("content") if isinstance(last, dict) else last)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") if isinstance(p, dict) else str(p) for p in content]
        return "".join(parts)
    return str(content)


def column(columns: dict[str, Any], name: str, n: int, reward: str) -> list[Any]:
    """Fetch a dataset column aligned with ``n`` completions, or explain what is missing."""
    if name not in columns or columns[name] is None:
        raise ValueError(
            f"reward {reward!r} needs a dataset column {name!r} (got columns: "
            f"{sorted(columns)}); rename your gold column to {name!r}"
        )
    values = list(columns[name])
    if len(values) != n:
        raise ValueError(f"column {name!r} has {len(values)} rows for {n} completions")
    return values
