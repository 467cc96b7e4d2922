"""What a reward function's answer must be, and how strictly it is taken (`RewardChecks`).

TRL's contract: `fn(prompts, completions, completion_ids, **columns) -> list[float | None]`.
Where we are stricter than TRL: a wrong-length answer is an error naming the function (TRL
broadcasts it silently), and `None` becomes NaN ("not scored"), which the advantage estimators
leave out of the statistics. A value that is not a finite number within float32's range (inf,
-inf, 1e39, and NaN unless `RewardChecks.nan_as_unscored`) is an error naming the function and
the sample: such a value would zero its group or turn every weight into NaN. Lists, tuples,
tensors and numpy arrays of floats, ints, bools or numpy scalars are accepted; a string (even
"2") is refused, as TRL's `torch.tensor` refuses it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from reward_fns import reward_name

FLOAT32_MAX = float(torch.finfo(torch.float32).max)


class RewardFunctionError(RuntimeError):
    """A reward function failed or broke the contract; the message names it."""


@dataclass(frozen=True)
class RewardChecks:
    """How strictly reward answers are taken, and where the functions run
    (`GRPOConfig.reward_timeout`, `nan_rewards_as_unscored`, `isolate_user_code`)."""

    timeout: float | None = None  # seconds per call; None: no limit
    nan_as_unscored: bool = False  # NaN means "not scored" (like None) instead of an error
    isolate: bool = True  # the user's functions in the worker process (`user_code/worker.py`)

    @classmethod
    def from_args(cls, args: Any) -> RewardChecks:
        """The checks a `GRPOConfig` asks for."""
        return cls(args.reward_timeout, args.nan_rewards_as_unscored, args.isolate_user_code)


def _check_value(name: str, value: Any, index: int, checks: RewardChecks) -> float:
    """One reward as a float (NaN = not scored), or RewardFunctionError naming the sample."""
    if value is None:
        return math.nan
    try:
        if isinstance(value, (str, bytes, bytearray)):  # "2" is text, not a score (TRL's
            raise TypeError  # torch.tensor refuses it too); float() would take it silently
        out = float(value)
    except (TypeError, ValueError, OverflowError) as err:
        raise RewardFunctionError(
            f"reward function {name!r} returned {value!r} for sample {index}; expected a float or "
            "None."
        ) from err
    if math.isnan(out):
        if checks.nan_as_unscored:
            return math.nan
        raise RewardFunctionError(
            f"reward function {name!r} returned NaN for sample {index}; return None for 'not "
            "scored' (or set nan_rewards_as_unscored=True to read NaN that way)."
        )
    if not abs(out) <= FLOAT32_MAX:
        raise RewardFunctionError(
            f"reward function {name!r} returned {value!r} for sample {index}; rewards must be "
            f"finite numbers within float32's range (|r| <= {FLOAT32_MAX:.3g})."
        )
    return out


def to_column(fn: Callable, values: Any, n: int, checks: RewardChecks) -> list[float]:
    """`fn`'s answer for `n` completions as `n` floats (NaN: not scored), or RewardFunctionError."""
    name = reward_name(fn)
    if hasattr(values, "tolist") and not isinstance(values, (list, tuple)):
        values = values.tolist()  # a tensor or a numpy array
    if not isinstance(values, (list, tuple)):
        raise RewardFunctionError(
            f"reward function {name!r} returned {type(values).__name__}; it must return a list "
            f"with one float (or None) per completion ({n})."
        )
    values = list(values)
    if len(values) != n:
        raise RewardFunctionError(
            f"reward function {name!r} returned {len(values)} values for {n} completions; "
            "return exactly one float (or None for 'not scored') per completion."
        )
    return [_check_value(name, v, i, checks) for i, v in enumerate(values)]
