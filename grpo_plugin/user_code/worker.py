"""A process for the user's code (reward functions, tools), so that a time limit can always stop it.

A time limit kept inside the trainer's process (a timer thread, a signal handler) needs the
interpreter lock, and a call stuck in C code holds it: `re.match(r"(a+)+$", "a" * 60 + "b")`
backtracks for hours, and no thread, signal handler or timer of the process runs meanwhile. A
process can always be killed. So the rewards and tools the user wrote run in one worker process:

- **forked** from the trainer's process (`os.fork`): it holds every function, closure and object
  the trainer held at the fork, so only arguments and answers cross the boundary (pickled), never
  the functions. The trainer forks it once, early (`prepare`, before the model loads, so the copy
  holds little memory), and keeps it: a call costs a round trip over a socket.
- **killed** (SIGKILL) when a call runs past its time limit, and forked again by the next call.
- **watched**: a worker that dies (`os._exit`, a segfault, the kernel's OOM killer) ends the call
  with an error naming the exit (out of memory where the kernel counted an OOM kill meanwhile:
  `oom_kill` in /proc/vmstat or the cgroup's memory.events); it dies with the trainer
  (`PR_SET_PDEATHSIG`, Linux).
- **a session of its own** (`os.setsid`: its own process group, and no terminal, so that a
  terminal's `stty tostop` never stops a reward that prints with SIGTTOU), so that what the
  user's code starts (a `subprocess.Popen`) goes with it: replacing or stopping the worker, and
  the trainer's exit, kill the whole group.
  (A trainer killed by SIGKILL takes the worker with it, but a child of the worker lives on.)
  Its stdin is /dev/null (a reward that reads `sys.stdin` gets EOF, never the trainer's
  terminal), and the programs it starts get the default handling of SIGINT and SIGTERM.

What the user's code sees there: the process as it was at the fork. State it keeps for itself
(a cache, a counter) lives on across calls until the worker is replaced; what it writes into
other objects is not seen by the trainer's process, and what the trainer changes after the fork is
not seen by it (rewards get the trainer's live `trainer_state` as an argument). The global random
generators (`random`, NumPy's, torch's CPU one) travel with each call both ways, so a reward that
draws from them draws what it would have drawn in the trainer's process, resumes included.

Code that must share the trainer's memory stays in the process (`in_process_limit`): a last-resort
stop there is `faulthandler`'s C timer, which needs no interpreter lock: past its limit plus
`HARD_STOP_GRACE_S` it prints every thread's stack and ends the process (exit code 1).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import faulthandler
import logging
import os
import pickle
import random
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

HARD_STOP_GRACE_S = 30.0  # past a limit, how long an in-process call has before the process ends
_HEADER = struct.Struct("!Q")  # each message: its length, then the pickle
PR_SET_PDEATHSIG = 1


class WorkerTraceback(Exception):
    """The traceback of an exception raised in the worker (the cause of the error re-raised
    here, as `concurrent.futures` does for its processes)."""


class WorkerLost(Exception):
    """The worker ended (or was killed) before the call's answer came back."""


@dataclass
class Reply:
    """What a call gave back: `parts` streamed by the job, then its `result`, or why not."""

    parts: list[Any] = field(default_factory=list)
    result: Any = None
    error: BaseException | None = None  # raised by the job (a copy, with its traceback as cause)
    timed_out: bool = False  # killed at the time limit
    lost: str | None = None  # how the worker ended, when it ended by itself

    def value(self) -> Any:
        """The result, or the job's error raised again."""
        if self.error is not None:
            raise self.error
        return self.result


def supported() -> bool:
    """A worker can be forked here (not on Windows)."""
    return hasattr(os, "fork")


# --- the wire ------------------------------------------------------------------------------------
def _send(sock: socket.socket, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _recv(sock: socket.socket) -> Any:
    """The next message, or None at EOF."""
    header = _recv_exactly(sock, _HEADER.size)
    if header is None:
        return None
    data = _recv_exactly(sock, _HEADER.unpack(header)[0])
    return None if data is None else pickle.loads(data)


# --- the random generators travel with a call ------------------------------------------------------
def _rng_states() -> dict[str, Any]:
    states: dict[str, Any] = {"random": random.getstate()}
    if "numpy" in sys.modules:
        states["numpy"] = sys.modules["numpy"].random.get_state()
    if "torch" in sys.modules:
        states["torch"] = sys.modules["torch"].get_rng_state()
    return states


def _set_rng_states(states: dict[str, Any]) -> None:
    random.setstate(states["random"])
    if "numpy" in states and "numpy" in sys.modules:
        sys.modules["numpy"].random.set_state(states["numpy"])
    if "torch" in states and "torch" in sys.modules:
        sys.modules["torch"].set_rng_state(states["torch"])


# --- the worker's side -----------------------------------------------------------------------------
def _portable(err: BaseException) -> tuple[BaseException, str]:
    """`err` as something that pickles (itself, or a RuntimeError with its text), and its
    traceback as text."""
    text = "".join(traceback.format_exception(err))
    try:
        pickle.loads(pickle.dumps(err))
        return err, text
    except Exception:
        return RuntimeError(f"{type(err).__name__}: {err}"), text


def _ignore_here(signum: int, frame: Any) -> None:
    """The worker's SIGINT and SIGTERM: the trainer's to handle (see `_become_worker`)."""


def _detach_stdin() -> None:
    """The worker reads /dev/null, never the trainer's stdin (a terminal, a pipe)."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    with contextlib.suppress(Exception):
        sys.stdin = open(0, closefd=False)  # noqa: SIM115  (fd 0 is the process's, kept open)


def _become_worker(parent_pid: int) -> None:
    """Set up the forked child: a session of its own, die with the parent; stdin from
    /dev/null; leave Ctrl-C, SIGTERM and the watchdog's signals to the trainer; one torch thread
    (a fork of an OpenMP pool deadlocks otherwise)."""
    os.setsid()  # never the parent's setpgid: a group leader cannot start a session
    _detach_stdin()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before the line above
        os._exit(0)
    # Ctrl-C and SIGTERM are the trainer's to handle (a terminal's and a group's do not reach
    # this session; systemd's reach every process): it stops cleanly, and this one dies with it.
    # Not SIG_IGN: an ignored signal stays ignored across exec, and a program the user's code
    # starts would then outlive every Ctrl-C; a handler is reset to the default there.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _ignore_here)
    for sig in (signal.SIGUSR2, signal.SIGALRM):
        signal.signal(sig, signal.SIG_DFL)
    faulthandler.cancel_dump_traceback_later()
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def _serve(sock: socket.socket, table: dict[int, Any]) -> None:
    """The worker's loop: `(job, keys, payload, rng)` in; parts, then the answer, out."""
    lock = threading.Lock()

    def emit(part: Any) -> None:
        with lock:
            _send(sock, ("part", part))

    while True:
        message = _recv(sock)
        if message is None:  # the trainer closed the socket
            return
        job, keys, payload, rng = message
        _set_rng_states(rng)
        try:
            answer = ("done", job(tuple(table[k] for k in keys), payload, emit))
        except BaseException as err:  # SystemExit included: it is the job's error, not ours
            answer = ("raised", *_portable(err))
        with lock:
            try:
                _send(sock, (*answer, _rng_states()))
            except Exception as err:  # an answer that does not pickle
                _send(
                    sock,
                    (
                        "raised",
                        *_portable(TypeError(f"the answer cannot be sent back: {err}")),
                        None,
                    ),
                )


def _child_main(sock: socket.socket, table: dict[int, Any], parent_pid: int) -> None:
    code = 0
    try:
        _become_worker(parent_pid)
        _serve(sock, table)
    except BaseException:
        code = 70
    finally:
        os._exit(code)  # never the trainer's atexit handlers, nor its buffered output


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has ended: machine-wide (/proc/vmstat) plus in
    this process's cgroup (cgroup v2 memory.events, where a memory limit is set); None where
    neither can be read."""
    total, found = 0, False
    with contextlib.suppress(OSError, ValueError):
        for line in open("/proc/vmstat").read().splitlines():
            if line.startswith("oom_kill "):
                total, found = total + int(line.split()[1]), True
    with contextlib.suppress(OSError, ValueError, IndexError):
        relative = open("/proc/self/cgroup").read().splitlines()[0].split(":", 2)[2]
        events = open(f"/sys/fs/cgroup{relative.rstrip('/')}/memory.events").read()
        for line in events.splitlines():
            if line.startswith("oom_kill "):
                total, found = total + int(line.split()[1]), True
    return total if found else None


OUT_OF_MEMORY = "killed by SIGKILL: out of memory"  # how `Reply.lost` begins then


def _describe_exit(status: int, oom_before: int | None = None) -> str:
    """How a worker ended; `oom_before`: `oom_kills()` when its last call began."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        if number == signal.SIGKILL and oom_before is not None:
            now = oom_kills()
            if now is not None and now > oom_before:
                return f"{OUT_OF_MEMORY} (the kernel's OOM killer ended it)"
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(number).name}"
        return f"killed by signal {number}"
    return f"exit code {os.WEXITSTATUS(status)}"


# --- the trainer's side ----------------------------------------------------------------------------
class UserWorker:
    """One worker process for the user's code; `run` calls a job there under a time limit."""

    def __init__(self) -> None:
        self._known: dict[int, Any] = {}  # id -> object the worker holds (kept alive here)
        self._pid: int | None = None
        self._sock: socket.socket | None = None
        self._lock = threading.RLock()
        self._oom_before: int | None = None  # oom_kills() when the call began
        self._stops_at_exit = False

    @property
    def running(self) -> bool:
        return self._pid is not None

    def prepare(self, objects: Iterable[Any]) -> None:
        """Fork the worker now, holding `objects` (what it held before is let go: a trainer built
        after another one does not keep the first one's functions alive here)."""
        with self._lock:
            known = {id(o): o for o in objects}
            if known.keys() != self._known.keys() or not self.running:
                self._known = known
                self.stop()
                self._fork()

    def run(self, job: Callable, targets: tuple, payload: Any, timeout: float | None) -> Reply:
        """`job(targets, payload, emit)` in the worker: its `emit`ted parts and its result, its
        error, or `timed_out` (the worker killed) or `lost` (the worker ended by itself). `job` is
        a module-level function (pickled by name); `targets` are held by the worker (forked
        again first if it lacks one); `payload` travels pickled."""
        with self._lock:
            self._reap_if_ended()  # a worker that ended between calls is replaced, not blamed
            if not self.running or any(id(t) not in self._known for t in targets):
                self.prepare([*self._known.values(), *targets])
            keys = tuple(id(t) for t in targets)
            reply = Reply()
            try:
                request = pickle.dumps((job, keys, payload, _rng_states()), pickle.HIGHEST_PROTOCOL)
            except Exception as err:  # an argument that cannot travel: the call's error
                reply.error = TypeError(
                    f"its arguments cannot be sent to the worker process ({err})"
                )
                return reply
            self._oom_before = oom_kills()  # per call: not an OOM kill elsewhere hours ago
            try:
                self._sock.sendall(_HEADER.pack(len(request)) + request)
                self._collect(reply, timeout)
            except OSError:  # it ended while the request was being written
                reply.lost = self._reap()
            except BaseException:  # Ctrl-C while waiting: the call is abandoned with its worker
                self.stop()
                raise
            return reply

    def stop(self) -> None:
        """Kill the worker (if any); the next call forks a new one."""
        with self._lock:
            if self._sock is not None:
                self._sock.close()
            if self._pid is not None:
                _kill_group(self._pid)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(self._pid, 0)
                _kill_group(self._pid, reaped=True)  # what it started before the kill landed
            self._pid, self._sock = None, None

    def _fork(self) -> None:
        ours, theirs = socket.socketpair()
        parent_pid = os.getpid()
        rng = random.getstate()  # os.fork reseeds `random` in the child; the call sets it anyway
        for stream in (sys.stdout, sys.stderr):  # else the child would print their buffers again
            with contextlib.suppress(Exception):
                stream.flush()
        pid = os.fork()
        if pid == 0:  # the worker
            ours.close()
            random.setstate(rng)
            _child_main(theirs, dict(self._known), parent_pid)
        theirs.close()
        self._pid, self._sock = pid, ours
        if not self._stops_at_exit:  # what the user's code started ends with the trainer too
            atexit.register(self.stop)
            self._stops_at_exit = True
        logger.debug("user-code worker %d forked, holding %d objects", pid, len(self._known))

    def _collect(self, reply: Reply, timeout: float | None) -> None:
        """Read parts until the answer, the deadline (kill) or the worker's end."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                reply.timed_out = True
                self.stop()
                return
            ready, _, _ = select.select([self._sock], [], [], left)
            if not ready:
                continue
            message = _recv(self._sock)
            if message is None:
                reply.lost = self._reap()
                return
            if message[0] == "part":
                reply.parts.append(message[1])
                continue
            kind, value, *rest = message
            if kind == "done":
                reply.result = value
            else:
                reply.error = value
                reply.error.__cause__ = WorkerTraceback("\n" + rest[0])
            if rest[-1] is not None:
                _set_rng_states(rest[-1])
            return

    def _reap_if_ended(self) -> None:
        if self._pid is not None and os.waitpid(self._pid, os.WNOHANG)[0] == self._pid:
            _kill_group(self._pid, reaped=True)
            self._pid = None
            self.stop()

    def _reap(self) -> str:
        """How the worker ended (it closed its socket by ending)."""
        pid, self._pid = self._pid, None
        self._sock.close()
        self._sock = None
        _, status = os.waitpid(pid, 0)
        _kill_group(pid, reaped=True)  # its children, orphaned now
        return _describe_exit(status, self._oom_before)


def _kill_group(pid: int, reaped: bool = False) -> None:
    """SIGKILL the worker's process group (the worker and what it started). Before the worker is
    reaped, also the worker alone, where it has no group of its own yet; once reaped, its pid
    may be another process's, and only the group (which keeps the number while a member lives)
    is named."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        if not reaped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


_WORKER = UserWorker()


def shared_worker() -> UserWorker:
    """The process's one worker for the user's code (rewards and tools share it)."""
    return _WORKER


def _stderr_fd() -> int:
    """A descriptor for faulthandler's report: stderr's, even where `sys.stderr` was replaced by
    an object without one (a capture, a progress display)."""
    for stream in (sys.stderr, sys.__stderr__):
        with contextlib.suppress(AttributeError, ValueError, OSError):
            return stream.fileno()
    return 2


@contextlib.contextmanager
def in_process_limit(seconds: float | None) -> Iterator[None]:
    """The last-resort stop for user code that runs in this process: past `seconds` plus
    `HARD_STOP_GRACE_S`, faulthandler's C timer (no interpreter lock needed) prints every
    thread's stack to stderr and ends the process with exit code 1. One such limit at a time."""
    if not seconds:
        yield
        return
    faulthandler.dump_traceback_later(seconds + HARD_STOP_GRACE_S, exit=True, file=_stderr_fd())
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
