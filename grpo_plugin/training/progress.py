"""What a person sees while a run works: every phase worth waiting for, on stderr, as it happens.

    loading the model, evaluating, training, saving     -> one `ProgressBoard.task` each

- In a terminal (or Jupyter) the active tasks are live lines (rich): a spinner, the label, a bar
  when the total is known, a status (the trainer's step, reward, s/step, time left) and the time
  elapsed. A finished task leaves one line behind ("eval before training: 64/64 in 40.2 s").
- Elsewhere (a pipe, a log file, CI) the same fields as plain lines: one when a task starts, one
  when it ends, and one at least every `PLAIN_INTERVAL_S` seconds while it runs (a timer thread
  writes it even in the middle of a long step), so a log shows the run is alive.

Turned off, as the Trainer's own bar, by `disable_tqdm=True` (the callers check it). One board per
process: a phase the recipe pipeline shows and an evaluation the trainer shows during training sit
on the same live display (rich allows one at a time per console).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .._logging import visible

PLAIN_INTERVAL_S = 30.0
# Internal (tests): a shorter interval; 0 writes a plain line at every update and starts no timer.
INTERVAL_ENV = "GRPO_PLUGIN_PROGRESS_INTERVAL_S"


def plain_interval() -> float:
    """Seconds between two plain lines of a running task."""
    value = os.environ.get(INTERVAL_ENV)
    try:
        return max(0.0, float(value)) if value else PLAIN_INTERVAL_S
    except ValueError:
        return PLAIN_INTERVAL_S


def format_duration(seconds: float) -> str:
    """`42s`, `7m 05s`, `2h 03m`."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


class Task:
    """One phase on the board. `advance`/`update` move it; `finish` leaves its last line."""

    def __init__(
        self, board: ProgressBoard, label: str, total: int | None, status: str, unit: str = ""
    ) -> None:
        self.board, self.label, self.total, self.unit = board, label, total, unit
        self.completed, self.status = 0, status
        self.started = self.last_line = time.monotonic()
        self.rich_id: Any = None  # the task's id on the live display (terminal)
        self.done = False

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def count(self) -> str:
        return "" if self.total is None else f"{self.completed}/{self.total}{self.unit}"

    def line(self) -> str:
        """The task as one plain line: label and count, status, time elapsed."""
        head = f"{self.label} {self.count}".strip()
        return ", ".join([head, *([self.status] if self.status else [])]) + (
            f" ({format_duration(self.elapsed)})"
        )

    def advance(self, n: int = 1) -> None:
        self.update(completed=self.completed + n)

    def update(self, completed: int | None = None, status: str | None = None) -> None:
        self.completed = self.completed if completed is None else completed
        self.status = self.status if status is None else status
        self.board.moved(self)

    def finish(self, summary: str | None = None) -> None:
        """Off the board; `summary` (default: the task's last line) stays on screen."""
        if not self.done:
            self.done = True
            self.board.finished(self, self.line() if summary is None else summary)


class _NullTask(Task):
    """A task nobody sees (progress off, or not the main process)."""

    def __init__(self) -> None:
        self.completed, self.status, self.total, self.done = 0, "", None, False
        self.label, self.unit, self.started = "", "", time.monotonic()

    def update(self, completed: int | None = None, status: str | None = None) -> None:
        pass

    def finish(self, summary: str | None = None) -> None:
        pass


class ProgressBoard:
    """The active tasks of this process, shown live in a terminal or as plain lines elsewhere.

    `console`: a `rich.console.Console` (default: stderr). `live`: force the mode (default: live
    on an interactive terminal or in Jupyter). `interval`: seconds between plain lines (default
    `plain_interval()`).
    """

    def __init__(
        self, console: Any = None, live: bool | None = None, interval: float | None = None
    ):
        from rich.console import Console

        self.console = console or Console(stderr=True)
        c = self.console
        self.live = (
            (c.is_jupyter or (c.is_terminal and not c.is_dumb_terminal)) if live is None else live
        )
        self.interval = plain_interval() if interval is None else interval
        self.tasks: list[Task] = []
        self._lock = threading.RLock()
        self._display: Any = None  # rich.progress.Progress while a task is live
        self._timer: tuple[threading.Thread, threading.Event] | None = None
        self._closes_at_exit = False

    # --- tasks ---------------------------------------------------------------------------------
    def task(
        self,
        label: str,
        total: int | None = None,
        status: str = "",
        *,
        unit: str = "",
        announce: bool = True,
    ) -> Task:
        """Start showing a task ("label 3/48unit, status"); `announce`: a plain line when it
        starts (plain mode)."""
        task = Task(self, label, total, status, unit)
        with self._lock:
            self.tasks.append(task)
            if self.live:
                self._show_live(task)
            else:
                if announce:
                    self._write(task.line() if total is not None or status else f"{label} ...")
                self._start_timer()
        return task

    def moved(self, task: Task) -> None:
        with self._lock:
            if task.done:
                return
            if self.live and self._display is not None:
                self._display.update(task.rich_id, **self._fields(task))
                self._display.refresh()  # every update is seen, however short the run
            elif not self.live and time.monotonic() - task.last_line >= self.interval:
                self._write_task(task)

    def finished(self, task: Task, summary: str) -> None:
        timer = None
        with self._lock:
            if task in self.tasks:
                self.tasks.remove(task)
            if self.live and self._display is not None:
                self._display.remove_task(task.rich_id)
                if summary:
                    self._display.console.print(visible(summary), markup=False, highlight=False)
                if not self.tasks:
                    self._display.stop()
                    self._display = None
            elif summary:
                self._write(summary)
            if not self.tasks:
                timer, self._timer = self._timer, None
        if timer is not None:  # stopped outside the lock, which its thread may be waiting for
            thread, stop = timer
            stop.set()
            if thread is not threading.current_thread():
                thread.join(timeout=5)

    def close(self) -> None:
        """Take every task off the board without a summary (after an error); idempotent."""
        for task in list(self.tasks):
            task.finish("")

    @contextmanager
    def phase(
        self, label: str, summary: str | None = None, announce: bool = True
    ) -> Iterator[Task]:
        """A task for the duration of a `with` block; it leaves `summary` ("" for nothing;
        default: "label: done in 3.1 s") when the block ends, and nothing when it raises."""
        task = self.task(label, announce=announce)
        try:
            yield task
        except BaseException:
            task.finish("")
            raise
        default = f"{label}: done in {task.elapsed:.1f} s"
        task.finish(default if summary is None else summary)

    # --- terminal ------------------------------------------------------------------------------
    def _fields(self, task: Task) -> dict[str, Any]:
        return {
            "completed": task.completed,
            "total": task.total,
            "count": task.count,
            "status": task.status,
        }

    def _show_live(self, task: Task) -> None:
        from rich.progress import (
            BarColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        if self._display is None:
            self._display = Progress(
                SpinnerColumn(),
                TextColumn("[bold]{task.description}"),
                BarColumn(bar_width=32),
                TextColumn("{task.fields[count]}"),
                TextColumn("{task.fields[status]}"),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,  # finished tasks leave their summary line instead
                redirect_stderr=True,  # log lines print above the live lines
            )
            self._display.start()
            if not self._closes_at_exit:  # an exception must not leave the cursor hidden
                atexit.register(self.close)
                self._closes_at_exit = True
        fields = self._fields(task)
        total, completed = fields.pop("total"), fields.pop("completed")
        task.rich_id = self._display.add_task(
            task.label, total=total, completed=completed, **fields
        )

    # --- plain lines ---------------------------------------------------------------------------
    def _write(self, text: str) -> None:
        self.console.print(visible(text), markup=False, highlight=False, soft_wrap=True)

    def _write_task(self, task: Task) -> None:
        task.last_line = time.monotonic()
        self._write(task.line())

    def _start_timer(self) -> None:
        """Under the lock: a timer thread for the plain lines, unless one runs."""
        if self.interval <= 0 or self._timer is not None:
            return
        stop = threading.Event()
        thread = threading.Thread(
            target=self._beat, args=(stop,), name="grpo-progress", daemon=True
        )
        self._timer = (thread, stop)
        thread.start()

    def _beat(self, stop: threading.Event) -> None:
        """Timer thread: a line for each task that has been quiet for `interval` seconds."""
        tick = min(1.0, self.interval / 4)
        while not stop.wait(tick):
            with self._lock:
                if stop.is_set():
                    return
                for task in self.tasks:
                    if time.monotonic() - task.last_line >= self.interval:
                        self._write_task(task)


_BOARD: ProgressBoard | None = None


def board() -> ProgressBoard:
    """This process's board (created on first use)."""
    global _BOARD
    if _BOARD is None:
        _BOARD = ProgressBoard()
    return _BOARD


def close() -> None:
    """Take every task off this process's board (after an error): no live line is left."""
    if _BOARD is not None:
        _BOARD.close()


@contextmanager
def phase(
    label: str, *, enabled: bool = True, summary: str | None = None, announce: bool = True
) -> Iterator[Task]:
    """`ProgressBoard.phase` on this process's board; nothing shown when `enabled` is False."""
    if not enabled:
        yield _NullTask()
        return
    with board().phase(label, summary=summary, announce=announce) as shown:
        yield shown
