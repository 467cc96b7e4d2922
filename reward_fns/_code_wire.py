"""The candidate-judge channel of ``code_tests``: length-prefixed JSON frames, values as data.

Loaded inside the sandbox by ``reward_fns._sandbox_init`` (standard library only). A value crosses
as a JSON tree whose objects are one-key tags: ``{"t": [...]}`` tuple, ``{"d": [[k, v], ...]}``
dict, ``{"s": ...}`` set, ``{"f": ...}`` frozenset, ``{"b": hex}`` bytes, ``{"c": [re, im]}``
complex, ``{"i": hex}`` an int beyond 64 bits, ``{"r": n}`` a handle on an object that stays in
the candidate's process. :func:`decode` is the judge's side of the trust line: whatever bytes the
candidate sends, only built-in values (and handles) come out, so no code of the candidate's runs
when the judge compares them. ``pickle`` would run its code; ``marshal`` is not meant for hostile
input.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~25 ms of imports (re, enum...) in every sandboxed run
    from typing import Any

MAX_FRAME = 16 << 20


class LinkError(Exception):
    """The candidate's process is gone or broke the protocol: this and later requests fail."""


class _ScannerOptions:
    """What ``_json.make_scanner`` reads from a ``json.JSONDecoder``."""

    strict = True
    object_hook = object_pairs_hook = None
    parse_float, parse_int, parse_constant = float, int, float  # NaN, Infinity, -Infinity


_codec: list = []


def _dumps_loads():
    """JSON on the C accelerator ``_json`` that ``json`` itself wraps: ``import json`` costs
    ~11 ms in every assert run (it compiles regular expressions), ``_json`` 0.3 ms. ``json``
    where ``_json`` is missing."""
    if not _codec:
        try:
            import _json

            encoder = _json.make_encoder(
                None, None, _json.encode_basestring_ascii, None, ":", ",", False, False, True
            )
            scanner = _json.make_scanner(_ScannerOptions())

            def dumps(message: Any) -> str:
                return "".join(encoder(message, 0))

            def loads(data: bytes) -> Any:
                text = data.decode("utf-8")
                value, end = scanner(text, 0)
                if end != len(text):
                    raise ValueError(f"extra data at {end}")
                return value

        except (ImportError, AttributeError, TypeError):
            import json

            def dumps(message: Any) -> str:
                return json.dumps(message, separators=(",", ":"))

            loads = json.loads
        _codec[:] = [dumps, loads]
    return _codec


def dumps(message: Any) -> str:
    return _dumps_loads()[0](message)


def send(fd: int, message: Any) -> None:
    data = dumps(message).encode()
    view = memoryview(len(data).to_bytes(4, "big") + data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exact(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise LinkError("the candidate's process closed the channel")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive(fd: int) -> Any:
    size = int.from_bytes(_read_exact(fd, 4), "big")
    if size > MAX_FRAME:
        raise LinkError(f"a message of {size} bytes is over the {MAX_FRAME}-byte cap")
    try:
        return _dumps_loads()[1](_read_exact(fd, size))
    except (ValueError, RecursionError, StopIteration) as exc:  # StopIteration: no JSON at all
        raise LinkError(f"unreadable message: {exc}") from None


_TAGGED = ((tuple, "t"), (set, "s"), (frozenset, "f"))


def encode(value: Any, make_ref) -> Any:
    """A JSON tree for ``value``; anything that is not plain data becomes ``{"r": make_ref(v)}``.

    Subclasses of built-in types are sent as the base type (a namedtuple as a tuple, a Counter
    as a dict, an ``int`` subclass as its integer value), since the judge never calls their code.
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        value = int.__index__(value)
        return value if -(2**63) < value < 2**63 else {"i": hex(value)}
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, list):
        return [encode(v, make_ref) for v in list.__iter__(value)]
    if isinstance(value, dict):
        return {"d": [[encode(k, make_ref), encode(v, make_ref)] for k, v in dict.items(value)]}
    for kind, tag in _TAGGED:
        if isinstance(value, kind):
            return {tag: [encode(v, make_ref) for v in kind.__iter__(value)]}
    if isinstance(value, (bytes, bytearray)):
        return {"b": bytes(value).hex()}
    if isinstance(value, complex):
        return {"c": [value.real, value.imag]}
    tolist = getattr(type(value), "tolist", None)  # numpy arrays and scalars
    if callable(tolist) and type(value).__module__.split(".")[0] == "numpy":
        return encode(tolist(value), make_ref)
    return {"r": make_ref(value)}


def decode(node: Any, resolve_ref) -> Any:
    """Plain built-in values from an :func:`encode` tree; the judge's side of the trust line.

    Only ``None``, ``bool``, ``int``, ``float``, ``str``, ``list``, ``tuple``, ``dict``, ``set``,
    ``frozenset``, ``bytes`` and ``complex`` can come out, plus ``resolve_ref(n)`` for a handle.
    """
    if node is None or type(node) in (bool, int, float, str):
        return node
    if type(node) is list:
        return [decode(v, resolve_ref) for v in node]
    if type(node) is not dict or len(node) != 1:
        raise LinkError(f"not a value: {str(node)[:80]}")
    ((tag, body),) = node.items()
    if tag == "d" and type(body) is list:
        return {decode(k, resolve_ref): decode(v, resolve_ref) for k, v in body}
    for kind, kind_tag in _TAGGED:
        if tag == kind_tag and type(body) is list:
            return kind(decode(v, resolve_ref) for v in body)
    if tag == "i" and type(body) is str:
        return int(body, 16)
    if tag == "b" and type(body) is str:
        return bytes.fromhex(body)
    if tag == "c" and type(body) is list and len(body) == 2:
        return complex(float(body[0]), float(body[1]))
    if tag == "r" and type(body) is int:
        return resolve_ref(body)
    raise LinkError(f"unknown tag {tag!r}")
