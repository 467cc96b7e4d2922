"""What a reward function may receive besides the batch, exactly as TRL 1.16 passes it.

- `trainer_state`: the `transformers.TrainerState` (global step, epoch, log history), for rewards
  that change with training progress;
- `log_extra(column, values)`: extra columns (one value per completion) for the completions table
  (`completions/step_XXXXX.parquet`);
- `log_metric(name, value)`: a scalar averaged into the next log line, next to `reward`, `kl`, ...

Both are buffered here, as in TRL, until the code that scored the completions collects them: a
training rollout (its completions table, its metrics) or an evaluation (its `eval_` metrics;
columns logged while evaluating have no table and are dropped).

TRL passes the three to every function, so its reward functions must take `**kwargs`. Here a
function receives only the ones it declares (by name, or all of them through `**kwargs`), so a
function written without them keeps working. A function in the worker process (`calls.py`) gets
the trainer's state at the call, and logs into a context of its own there, which is sent back
with its answer and `absorb`ed here.
"""

from __future__ import annotations

import inspect
import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from .. import distributed
from .._logging import warn_once
from ..rollout.types import Rollout

logger = logging.getLogger(__name__)

TRAINER_KWARGS = ("trainer_state", "log_extra", "log_metric")


class RewardContext:
    """The trainer-side objects behind `trainer_state`, `log_extra` and `log_metric`."""

    def __init__(self, get_state: Callable[[], Any]):
        self._get_state = get_state
        self.extra_columns: dict[str, list[Any]] = defaultdict(list)
        self.metrics: dict[str, list[float]] = defaultdict(list)

    @classmethod
    def of(cls, trainer: Any) -> RewardContext:
        """The context of a `GRPOTrainer` (its live `state`)."""
        return cls(lambda: trainer.state)

    def state(self) -> Any:
        """The trainer's state now."""
        return self._get_state()

    def trainer_kwargs(self, fn: Callable) -> dict[str, Any]:
        """The trainer kwargs `fn` declares, with their values now."""
        wanted = declared_trainer_kwargs(fn)
        return {k: v for k, v in self.kwargs().items() if k in wanted} if wanted else {}

    def log_extra(self, column: str, values: list[Any]) -> None:
        """Add `values` (one per completion) to the completions table's `column`."""
        self.extra_columns[column].extend(values)

    def log_metric(self, name: str, value: float) -> None:
        """Average `value` into the metric `name` of the next log line."""
        self.metrics[name].append(float(value))

    def kwargs(self) -> dict[str, Any]:
        return {
            "trainer_state": self._get_state(),
            "log_extra": self.log_extra,
            "log_metric": self.log_metric,
        }

    def pop_extra_columns(self) -> dict[str, list[Any]]:
        """The columns logged since the last call (then forgotten)."""
        columns, self.extra_columns = dict(self.extra_columns), defaultdict(list)
        return columns

    def pop_metric_values(self) -> dict[str, list[float]]:
        """Every value logged per metric since the last call (then forgotten)."""
        values, self.metrics = dict(self.metrics), defaultdict(list)
        return values

    def pop_raw(self) -> tuple[dict[str, list[Any]], dict[str, list[float]]]:
        """What was logged since the last call, as logged: `(extra columns, metric values)`
        (what a worker process sends back with a reward's answer)."""
        return self.pop_extra_columns(), self.pop_metric_values()

    def absorb(self, columns: dict[str, list[Any]], metrics: dict[str, list[float]]) -> None:
        """Take in what a reward logged elsewhere (`pop_raw` of the worker's context)."""
        for name, values in columns.items():
            self.extra_columns[name].extend(values)
        for name, values in metrics.items():
            self.metrics[name].extend(values)

    def pop_logged(self) -> tuple[dict[str, list[Any]], dict[str, float]]:
        """What the rewards logged since the last call: `(extra columns, metric means)`."""
        means = {k: sum(v) / len(v) for k, v in self.pop_metric_values().items() if v}
        return self.pop_extra_columns(), means


def declared_trainer_kwargs(fn: Callable) -> tuple[str, ...]:
    """Which of `TRAINER_KWARGS` `fn` accepts: all with `**kwargs`, else those it names."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return TRAINER_KWARGS
    names = {p.name for p in params}
    return tuple(k for k in TRAINER_KWARGS if k in names)


def aligned_extra_columns(columns: dict[str, list[Any]], rows: int) -> dict[str, list[Any]]:
    """The `log_extra` columns with one value per completion; the others are left out, once with a
    warning (dynamic sampling's refills, or a reward that logged the wrong number of values)."""
    kept = {k: v for k, v in columns.items() if len(v) == rows}
    for name in sorted(set(columns) - set(kept)):
        warn_once(
            f"log-extra-{name}",
            f"log_extra column {name!r} has {len(columns[name])} values for {rows} completions; "
            "it is left out of the completions table (log one value per completion).",
            logger,
        )
    return kept


def gather_extra_columns(
    accelerator: Any, columns: dict[str, list[Any]], rows: int
) -> dict[str, list[Any]]:
    """Every process's `log_extra` columns, concatenated in process order (a collective), as TRL
    does: a column one process did not log is None for its `rows` completions."""
    parts = distributed.gather_objects(accelerator, (columns, rows))
    names = sorted({name for logged, _ in parts for name in logged})
    return {
        name: [v for logged, n in parts for v in logged.get(name, [None] * n)] for name in names
    }


def warn_if_unscored(rollout: Rollout) -> int:
    """Warn (as TRL does) when every reward function returned None for some completion; returns
    how many completions no function scored (their advantage is 0)."""
    unscored = torch.isnan(rollout.per_func).all(dim=1)  # (N,)
    count = int(unscored.sum())
    if count:
        i = int(unscored.nonzero()[0])
        row = {k: v[i] for k, v in rollout.columns.items()}
        prompt, completion = rollout.prompts[i], rollout.completions[i]
        logger.warning(
            "All reward functions returned None for the following kwargs: %r (sample %d; %d of %d "
            "completions unscored); they get advantage 0. Make sure at least one reward function "
            "scores every sample.",
            *({"prompt": prompt, "completion": completion, **row}, i, count, len(unscored)),
        )
    return count
