"""Inside the sandbox: run the candidate's program, and judge assert-style tests it cannot reach.

Loaded by ``reward_fns._sandbox_init`` (standard library only). Two roles, two processes:

- **candidate** (:func:`run_candidate`, uid A): runs the code as ``__main__``. For stdin/stdout
  cases that is all; the host compares the output. For asserts it then answers requests.
- **judge** (:func:`run_judge`, uid B, not dumpable): runs the test statements. Every name the
  code defined is a :class:`Remote` handle; calling one sends the arguments to the candidate, which
  calls its own function and sends the result back as **data**: JSON whose objects are one-key
  tags (tuple, dict, set, bytes, big int...). The judge rebuilds plain built-in values from it and
  evaluates the whole assert itself, so ``assert f(x)``, ``f(x) in (...)``, ``abs(f(x) - y) <
  1e-6`` or ``sorted(f(x)) == ...`` are decided by the judge's own ``==``, ``<``, ``bool``.

The usual harness runs tests in the candidate's interpreter, where an object whose ``__eq__`` is
always true, or a write to the result descriptor, passes every test. Here the candidate holds no
descriptor to the host, and an object it returns that is not plain data stays in its process: the
judge gets a :class:`Remote` that forwards calls, attributes, items, ``len``, iteration and
``str``, but refuses ``==``, ordering, ``in``, ``bool`` and ``hash`` (a question that carries the
expected value must not be answered by the candidate). Names that shadow a builtin are not
exported; a name the tests use as a module (``math.isclose``) is the judge's own stdlib module
whatever the code bound to it; and a name bound to a stdlib object (``from math import
isclose``) becomes the judge's copy of that object.

Not covered (the test fails, or, last item, is not protected): tests that pass their own objects
(lambdas, instances of classes they define) to the code; tests that compare or hash the code's
own class instances (``Point(1, 2) == Point(1, 2)``) or call ``isinstance`` with its classes;
output printed by the code; mutations of arguments deeper than the top-level list, dict or set
(the top level is copied back); globals the code changes after it has loaded; and a helper the
tests use but neither define nor import (``isclose(...)`` relying on the solution's import), which
the candidate may define to say yes (tests should import what they use).
"""

from __future__ import annotations

import atexit
import builtins
import marshal
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~25 ms of imports (re, enum...) in every sandboxed run
    from typing import Any

if __name__ == "_code_harness":  # loaded from its file by _sandbox_init, which loaded _code_wire
    import _code_wire as wire
else:
    from reward_fns import _code_wire as wire

_MAX_EXPORT = 1 << 16
_BUILTIN_NAMES = frozenset(dir(builtins))
_STOP = object()  # "the remote iterator is exhausted"


# ---- candidate side ------------------------------------------------------------------------


def _run_as_main(code: str) -> tuple[dict, int]:
    """Run ``code`` like ``python solution.py``: in a fresh ``__main__``; the exit status.

    Errors go through ``sys.excepthook``, the interpreter's C printer (``traceback`` would cost
    ~20 ms of imports in every failing run)."""
    module = type(sys)("__main__")
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    try:
        exec(compile(code, "solution.py", "exec"), module.__dict__)
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (exc.code is not None)
        if exc.code is not None and not isinstance(exc.code, int):
            sys.stderr.write(f"{exc.code}\n")  # what the interpreter prints for sys.exit("...")
    except BaseException:  # noqa: BLE001 - report it as the interpreter would
        sys.excepthook(*sys.exc_info())
        status = 1
    return module.__dict__, int(status) & 0xFF


def _finish(status: int) -> None:
    """What interpreter shutdown does for a script: join threads, run atexit, flush."""
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001
        status = status or 120
    os._exit(status)


def run_candidate(code: str, req_fd: int | None = None, resp_fd: int | None = None) -> None:
    """Run the program; with a channel, then serve the judge's requests until it hangs up."""
    namespace, status = _run_as_main(code)
    if req_fd is None:
        _finish(status)
    serve(namespace, req_fd, resp_fd)
    os._exit(0)


def serve(namespace: dict, req_fd: int, resp_fd: int) -> None:
    """Send the exports, then answer requests until the judge hangs up."""
    server = _Server(namespace)
    try:
        wire.send(resp_fd, {"exports": server.exports()})
        while True:
            wire.send(resp_fd, server.handle(wire.receive(req_fd)))
    except (wire.LinkError, OSError):  # the judge hung up (done, or it gave up on us)
        pass


class _Server:
    """The candidate's end: keeps objects the judge holds handles on, answers requests."""

    def __init__(self, namespace: dict) -> None:
        self.namespace = namespace
        self.objects: list[Any] = []
        self.ids: dict[int, int] = {}

    def ref(self, value: Any) -> int:
        if id(value) not in self.ids:
            self.ids[id(value)] = len(self.objects)
            self.objects.append(value)
        return self.ids[id(value)]

    def exports(self) -> dict[str, Any]:
        out = {}
        for name, value in list(self.namespace.items()):
            if name.startswith("__") or name in _BUILTIN_NAMES:
                continue
            if isinstance(value, type(sys)):
                out[name] = {"m": value.__name__}
            elif where := _stdlib_home(value):
                out[name] = {"g": where}
            else:
                out[name] = self.data_or_ref(value)
        return out

    def data_or_ref(self, value: Any) -> Any:
        """Small globals go as data; a big table (or a cycle) stays here behind a handle."""
        try:
            node = wire.encode(value, self.ref)
            if len(wire.dumps(node)) <= _MAX_EXPORT:
                return node
        except (ValueError, RecursionError):
            pass
        return {"r": self.ref(value)}

    def handle(self, request: dict) -> dict:
        try:
            target = self.objects[request["ref"]]
            op = request["op"]
            if op == "call":
                args = [wire.decode(a, self.objects.__getitem__) for a in request["args"]]
                kwargs = {k: wire.decode(v, self.objects.__getitem__) for k, v in request["kwargs"]}
                result = target(*args, **kwargs)
                back = [
                    wire.encode(a, self.ref) if type(a) in (list, dict, set) else None for a in args
                ]
                return {"ok": wire.encode(result, self.ref), "args": back}
            if op == "next":
                try:
                    return {"ok": wire.encode(next(target), self.ref)}
                except StopIteration:
                    return {"stop": True}
            result = {
                "getattr": lambda: getattr(target, request["name"]),
                "getitem": lambda: target[wire.decode(request["key"], self.objects.__getitem__)],
                "len": lambda: len(target),
                "iter": lambda: iter(target),
                "str": lambda: str(target),
            }[op]()
            return {"ok": wire.encode(result, self.ref)}
        except BaseException as exc:  # noqa: BLE001 - the judge re-raises it as data
            kind = next((k for k in type(exc).__mro__ if k.__module__ == "builtins"), Exception)
            return {"error": [kind.__name__, str(exc)[:2000]]}


def _stdlib_home(value: Any) -> list[str] | None:
    """``[module, qualname]`` when ``value`` is that stdlib object (the judge uses its own)."""
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or module == "builtins":
        return None
    if module.split(".")[0] not in sys.stdlib_module_names:
        return None
    found = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return [module, qualname] if found is value else None


# ---- judge side ----------------------------------------------------------------------------


class Remote:
    """A handle on an object in the candidate's process (see the module docstring)."""

    __slots__ = ("_link", "_ref")

    def __init__(self, link: _Link, ref: int) -> None:
        self._link, self._ref = link, ref

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._link.call(self._ref, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in Remote.__slots__:
            raise AttributeError(name)
        return self._link.request({"op": "getattr", "ref": self._ref, "name": name})

    def __getitem__(self, key: Any) -> Any:
        return self._link.request({"op": "getitem", "ref": self._ref, "key": self._link.out(key)})

    def __len__(self) -> int:
        n = self._link.request({"op": "len", "ref": self._ref})
        if type(n) is not int or n < 0:
            raise TypeError("len() of a candidate object must be a non-negative int")
        return n

    def __iter__(self):
        iterator = self._link.request({"op": "iter", "ref": self._ref})
        if not isinstance(iterator, Remote):
            raise TypeError("iter() of a candidate object must stay in its process")
        while (item := self._link.request({"op": "next", "ref": iterator._ref})) is not _STOP:
            yield item

    def __str__(self) -> str:
        text = self._link.request({"op": "str", "ref": self._ref})
        if type(text) is not str:
            raise TypeError("str() of a candidate object must be a str")
        return text

    def __repr__(self) -> str:
        return f"<candidate object #{self._ref}>"

    def _refuse(self, *args: Any) -> Any:
        raise TypeError(
            "the judge does not let a candidate object compare, hash, test membership or "
            "truth: return plain data (numbers, strings, lists, tuples, dicts, sets)"
        )

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _refuse
    __bool__ = __hash__ = __contains__ = _refuse


def _remote_error(name: Any, message: Any) -> BaseException:
    """The candidate's exception as a built-in one the tests can catch, never BaseException."""
    kind = getattr(builtins, name, None) if isinstance(name, str) else None
    if kind in (StopIteration, StopAsyncIteration):  # PEP 479: never a control-flow signal here
        kind = None
    if isinstance(kind, type) and issubclass(kind, Exception):
        try:
            return kind(str(message))
        except Exception:  # noqa: BLE001 - e.g. UnicodeDecodeError needs five arguments
            pass
    return RuntimeError(f"candidate raised {str(name)[:100]}: {str(message)[:2000]}")


class _Link:
    """The judge's end of the channel: one request, one reply, in order."""

    def __init__(self, req_fd: int, resp_fd: int) -> None:
        self.req_fd, self.resp_fd = req_fd, resp_fd
        self.remotes: dict[int, Remote] = {}
        self.broken: wire.LinkError | None = None

    def remote(self, ref: int) -> Remote:
        if ref not in self.remotes:
            self.remotes[ref] = Remote(self, ref)
        return self.remotes[ref]

    def out(self, value: Any) -> Any:
        def own_ref(obj: Any) -> int:
            if isinstance(obj, Remote) and obj._link is self:
                return obj._ref
            raise TypeError(f"cannot send a {type(obj).__name__} to the candidate's code")

        return wire.encode(value, own_ref)

    def exchange(self, request: dict) -> dict:
        if self.broken:
            raise self.broken
        try:
            wire.send(self.req_fd, request)
            reply = wire.receive(self.resp_fd)
            if type(reply) is not dict:
                raise wire.LinkError("a reply must be an object")
        except (wire.LinkError, OSError) as exc:
            self.broken = exc if isinstance(exc, wire.LinkError) else wire.LinkError(str(exc))
            raise self.broken from None
        if "error" in reply:
            error = reply["error"]
            raise _remote_error(*(error if type(error) is list and len(error) == 2 else ("", "")))
        return reply

    def request(self, request: dict) -> Any:
        reply = self.exchange(request)
        return _STOP if reply.get("stop") is True else wire.decode(reply.get("ok"), self.remote)

    def call(self, ref: int, args: tuple, kwargs: dict) -> Any:
        sent = [self.out(a) for a in args]
        request = {"op": "call", "ref": ref, "args": sent}
        request["kwargs"] = [[k, self.out(v)] for k, v in kwargs.items()]
        reply = self.exchange(request)
        result = wire.decode(reply.get("ok"), self.remote)
        back = reply.get("args")
        for arg, new in zip(args, back if type(back) is list else []):
            _copy_back(arg, wire.decode(new, self.remote) if new is not None else None)
        return result


def _copy_back(arg: Any, new: Any) -> None:
    """The candidate's in-place change to a top-level list, dict or set argument."""
    if type(arg) is not type(new):
        return
    if type(arg) is list:
        arg[:] = new
    elif type(arg) in (dict, set):
        arg.clear()
        arg.update(new)


def _import_allowed(name: Any, packages: list[str]) -> Any:
    if not isinstance(name, str) or not all(p.isidentifier() for p in name.split(".")):
        return None
    if name.split(".")[0] not in sys.stdlib_module_names and name.split(".")[0] not in packages:
        return None
    try:
        __import__(name)
        return sys.modules[name]
    except Exception:  # noqa: BLE001
        return None


def _stdlib_object(where: list, packages: list[str]) -> Any:
    """The judge's own copy of a public stdlib object the code says it bound (``from math import
    isclose``): never from ``builtins``, never a private name such as ``os._exit``."""
    module, qualname = ([str(part) for part in where] + ["", ""])[:2]
    parts = qualname.split(".")
    if module == "builtins" or not qualname or any(p.startswith("_") for p in parts):
        return None
    value = _import_allowed(module, packages)
    for part in parts if value is not None else []:
        value = getattr(value, part, None)
    # Only a function, class or builtin that names itself so (what _stdlib_home sends for
    # `from math import isclose`); never an instance such as unittest.mock.ANY.
    if getattr(value, "__qualname__", None) != qualname:
        return None
    return value


def _judge_scope(exports: Any, link: _Link, packages: list[str], as_module: set[str]) -> dict:
    """The tests' globals: the code's names as the judge's own stdlib objects, data, or handles.

    A name the tests use as a module (``math.isclose``; ``as_module``) that is a stdlib module
    or an allowed package is that module, whatever the code bound to it.
    """
    scope: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    for name, node in (exports if type(exports) is dict else {}).items():
        if not isinstance(name, str) or name.startswith("__") or name in _BUILTIN_NAMES:
            continue
        if name in as_module and (name in sys.stdlib_module_names or name in packages):
            value = _import_allowed(name, packages)
        elif type(node) is dict and set(node) == {"m"}:
            value = _import_allowed(node["m"], packages)
        elif type(node) is dict and set(node) == {"g"} and type(node["g"]) is list:
            value = _stdlib_object(node["g"], packages)
        else:
            try:
                value = wire.decode(node, link.remote)
            except (wire.LinkError, ValueError, TypeError, RecursionError):
                value = None
        if value is not None:
            scope[name] = value
    return scope


def compile_tests(source: str) -> bytes:
    """The judge's input, made on the host: each top-level statement's source on its own, with
    whether it is an assert, and the names the tests use as modules. The judge then needs no
    ``ast`` (~15 ms of imports per run); plain source, not code objects, so that the judge may
    run on another interpreter version (level ``rlimits`` as root uses the system python3)."""
    import ast

    tree = ast.parse(source)
    statements = [(ast.unparse(stmt), isinstance(stmt, ast.Assert)) for stmt in tree.body]
    as_module = {
        node.value.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
    }
    return marshal.dumps((statements, sorted(as_module)))


def judge(judge_input: bytes, req_fd: int, resp_fd: int, packages: list[str]) -> list[bool]:
    """Run the tests of :func:`compile_tests` against the candidate behind the channel; one
    verdict per top-level assert (one for all statements when there is none)."""
    statements, as_module = marshal.loads(judge_input)  # from the host, never the candidate
    link = _Link(req_fd, resp_fd)
    try:
        hello = wire.receive(resp_fd)
        exports = hello.get("exports") if type(hello) is dict else None
    except wire.LinkError:
        exports = None
    scope = _judge_scope(exports, link, packages, set(as_module))
    verdicts, all_ok = [], True
    for source, is_assert in statements:
        try:
            exec(compile(source, "tests.py", "exec"), scope)
            ok = True
        except BaseException:  # noqa: BLE001 - a failed statement is a failed test
            ok = False
        all_ok = all_ok and ok
        if is_assert:
            verdicts.append(ok)
    return verdicts if any(is_assert for _, is_assert in statements) else [all_ok]


def run_judge(tests_fd: int, results_fd: int, req_fd: int, resp_fd: int, packages: list) -> None:
    """The judge's process: ``P``/``F`` per verdict, then ``E``, to the host's descriptor."""
    with os.fdopen(tests_fd, "rb") as f:
        verdicts = judge(f.read(), req_fd, resp_fd, packages)
    os.write(results_fd, b"".join(b"P\n" if ok else b"F\n" for ok in verdicts) + b"E\n")
    os._exit(0)
