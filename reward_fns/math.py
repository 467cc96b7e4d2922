"""``math``: symbolic answer equivalence with Hugging Face's ``math-verify``, gold first.

math-verify guards ``parse``/``verify`` with ``signal.alarm``, which raises off the main thread
(Math-Verify issues #50/#55), so reward code running in a trainer's worker thread or inside an
``async`` reward cannot use it. Here math-verify is called with ``parsing_timeout=None`` and
``timeout_seconds=None`` inside long-lived worker *processes*, and our own wall-clock timeout
(``select`` on the worker's pipe) works from any thread; a worker that overruns is killed and
replaced, so a sympy blow-up cannot pin a core. Its ``TimeoutException`` derives from
``BaseException``; the worker catches ``BaseException`` around every call.

Scores: 1.0 equivalent, 0.0 not (or timed out), ``None`` when the gold cannot be parsed (a
bare LaTeX gold such as ``\\sqrt{8}`` is retried inside ``$...$``).
Departure from open-r1's ``accuracy_reward``: same library and gold-first order, but no SIGALRM
and a hard kill on timeout.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import select
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from reward_fns.registry import column, completion_text, in_process, register

logger = logging.getLogger(__name__)

# A script, not an import: the worker starts without importing reward_fns (or torch).
_WORKER_SCRIPT = str(Path(__file__).with_name("_math_worker.py"))
_STARTUP_TIMEOUT_S = 120.0


class _Worker:
    """One math-verify process, talking JSON lines over its stdin/stdout."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", _WORKER_SCRIPT],  # -I: its folder (with math.py) not on sys.path
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._buffer = b""
        reply = self.read_line(_STARTUP_TIMEOUT_S)
        if reply is None or "ready" not in reply:
            self.kill()
            detail = reply.get("error") if reply else "no reply"
            raise RuntimeError(
                f"the math reward could not start math-verify ({detail}); "
                "install it with `pip install math-verify`"
            )

    def read_line(self, timeout: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def ask(self, gold: str, pred: str, timeout: float) -> dict[str, Any] | None:
        try:
            self.proc.stdin.write((json.dumps({"gold": gold, "pred": pred}) + "\n").encode())  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
        except (BrokenPipeError, OSError):
            return None
        return self.read_line(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class _WorkerPool:
    """At most ``size`` workers, started lazily, shared by all threads."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.idle: queue.Queue[_Worker] = queue.Queue()
        self.started = 0
        self.lock = threading.Lock()
        self.all: set[_Worker] = set()

    def acquire(self) -> _Worker:
        while True:
            with self.lock:
                grow = self.idle.empty() and self.started < self.size
                if grow:
                    self.started += 1
            if grow:
                return self._start()
            try:  # poll: a worker killed on timeout frees a slot without an idle worker
                return self.idle.get(timeout=0.05)
            except queue.Empty:
                continue

    def _start(self) -> _Worker:
        try:
            worker = _Worker()
        except BaseException:
            with self.lock:
                self.started -= 1
            raise
        with self.lock:
            self.all.add(worker)
        return worker

    def release(self, worker: _Worker, healthy: bool) -> None:
        if healthy:
            self.idle.put(worker)
            return
        worker.kill()
        with self.lock:
            self.all.discard(worker)
            self.started -= 1

    def shutdown(self) -> None:
        with self.lock:
            workers, self.all = list(self.all), set()
        for worker in workers:
            worker.kill()


_POOL = _WorkerPool(size=max(1, min(4, os.cpu_count() or 1)))
atexit.register(_POOL.shutdown)


def verify_answer(gold: str, pred: str, timeout: float = 5.0) -> float | None:
    """math-verify equivalence of ``pred`` to ``gold`` (gold first), safe from any thread."""
    worker = _POOL.acquire()
    reply = None
    try:
        reply = worker.ask(gold, pred, timeout)
    finally:
        _POOL.release(worker, healthy=reply is not None)
    if reply is None:
        logger.warning("math-verify timed out after %.1fs; scoring 0.0", timeout)
        return 0.0
    return reply["score"]


@register("math")
@in_process
def math(
    prompts: Any = None,
    completions: Any = None,
    completion_ids: Any = None,
    *,
    column_name: str = "answer",
    timeout: float = 5.0,
    **columns: Any,
) -> list[float | None]:
    """1.0 when math-verify finds the completion's answer equivalent to the gold (gold first)."""
    texts = [completion_text(c) for c in completions]
    golds = column(columns, column_name, len(texts), "math")
    if not texts:
        return []

    def one(pair: tuple[Any, str]) -> float | None:
        gold, text = pair
        if gold is None or not str(gold).strip():
            return None
        return verify_answer(str(gold), text, timeout)

    with ThreadPoolExecutor(max_workers=min(_POOL.size, len(texts))) as pool:
        return list(pool.map(one, zip(golds, texts)))
