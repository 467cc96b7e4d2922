"""A time limit for a reward call in the trainer's own process, in the main thread.

Rewards that run here (reward models, the bounded built-ins, `reward_fns.in_process` ones:
`calls.py`) are called from the main thread, where math-verify's `signal.alarm` timeouts work.
A timer thread sends `SIGNAL` to the main thread when the limit passes; its handler raises
`CallTimeout` in the call (a `BaseException`, so a reward's own `except Exception` cannot
swallow it). A blocking sleep, socket read or pure-Python loop is interrupted that way. A call
stuck inside C code is not: the timer thread needs the interpreter lock that the call holds.
That case is left to `isolation.in_process_limit` (a C timer ends the process), and the user's
own rewards run in a worker process, where a time limit kills the worker instead.

`SIGNAL` is SIGUSR2 (alarm-based timeouts such as math-verify's use SIGALRM, and share its timer,
so they keep working inside a limited call). Off the main thread, no limit is applied.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

SIGNAL = signal.SIGUSR2


class CallTimeout(BaseException):
    """The limited call ran past its time limit."""


@contextmanager
def time_limit(seconds: float | None, what: str) -> Iterator[None]:
    """Raise `CallTimeout` in the block if it runs longer than `seconds` (None: no limit)."""
    main = threading.main_thread()
    if not seconds or threading.current_thread() is not main or not hasattr(signal, "pthread_kill"):
        yield
        return
    running = [True]

    def on_signal(signum, frame) -> None:
        if running[0]:
            running[0] = False
            raise CallTimeout(f"{what} did not return within {seconds:g} s")

    def interrupt() -> None:
        if running[0]:
            signal.pthread_kill(main.ident, SIGNAL)

    previous = signal.signal(SIGNAL, on_signal)
    timer = threading.Timer(seconds, interrupt)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        try:
            running[0] = None
        finally:
            timer.cancel()
            timer.join()
            signal.signal(SIGNAL, previous)
