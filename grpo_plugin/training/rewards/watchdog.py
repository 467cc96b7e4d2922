"""A time limit for a call that must run in the main thread: reward functions.

Rewards are called from the main thread because some need it (math-verify's default timeouts use
`signal.alarm`, which only works there), so a hung reward cannot simply be abandoned in a worker
thread. Instead a timer thread sends `SIGNAL` to the main thread when the limit passes; its
handler raises `CallTimeout` in the call (a `BaseException`, so a reward's own `except Exception`
cannot swallow it). A blocking sleep, socket read or pure-Python loop is interrupted that way. A
call stuck inside C code that never returns to the interpreter cannot be: after a further
`HARD_STOP_GRACE_S` the process is stopped with exit code 124 and a message naming the call,
rather than hanging forever (the last checkpoint is intact).

`SIGNAL` is SIGUSR2 (alarm-based timeouts such as math-verify's use SIGALRM, and share its timer,
so they keep working inside a limited call). Off the main thread, no limit is applied.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger(__name__)

SIGNAL = signal.SIGUSR2
HARD_STOP_GRACE_S = 30.0
HARD_STOP_EXIT_CODE = 124


class CallTimeout(BaseException):
    """The limited call ran past its time limit."""


def _hard_stop(what: str, seconds: float) -> None:
    message = (
        f"{what} did not return within {seconds:g} s and could not be interrupted (it is stuck "
        f"outside Python); stopping the process. Make it return, or raise reward_timeout."
    )
    logger.critical(message)
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    os._exit(HARD_STOP_EXIT_CODE)


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

    def hard_stop() -> None:
        if running[0] is not None:  # None: the block has ended
            _hard_stop(what, seconds)

    previous = signal.signal(SIGNAL, on_signal)
    timers = [
        threading.Timer(seconds, interrupt),
        threading.Timer(seconds + HARD_STOP_GRACE_S, hard_stop),
    ]
    for timer in timers:
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        try:
            running[0] = None
        finally:
            for timer in timers:
                timer.cancel()
            timers[0].join()
            signal.signal(SIGNAL, previous)
