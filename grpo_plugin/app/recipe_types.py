"""Recipe values against their fields' types, before `HfArgumentParser.parse_dict` sees them.

`parse_dict` does not convert values, and PyYAML reads `1e-3` as the string "1e-3" (YAML 1.1 wants
a dot in a float), `yes` as True and `8` quoted as "8". Each value is checked against the field's
type annotation (`GRPOConfig`'s and `RecipeArguments`'): what the type allows is converted ("1e-3"
-> 0.001 for a float field, "8" -> 8 and 8.0 -> 8 for an int field, 3 -> 3.0 for a float field),
the rest is refused with one line naming the field and the type it expects (`beta: yes` is a bool,
not a number; `max_steps: 2.5` is not an integer). Unions try their members in order; `None` is
allowed where the type is Optional (or the field's default is None); `Literal` and enum members
accept their values. Types this module does not know (a dataclass, `Any`) pass unchanged.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any, Literal, Union

_BOOL_WORDS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


class _Mismatch(Exception):
    """The value does not fit the type (and cannot be converted to it)."""


@dataclasses.dataclass(frozen=True)
class FieldType:
    """A field's annotation and whether its default is None."""

    annotation: Any
    default_none: bool


def field_types(*classes: type) -> dict[str, FieldType]:
    """`{field name: FieldType}` over the init fields of the dataclasses `classes`."""
    out = {}
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.init:
                out[f.name] = FieldType(hints[f.name], f.default is None)
    return out


def _members(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _parse_str(value: str, member: Any) -> Any:
    """`value` (a string) read as `member` (int, float or bool), else `_Mismatch`."""
    text = value.strip()
    try:
        if member is bool and text.lower() in _BOOL_WORDS:
            return _BOOL_WORDS[text.lower()]
        if member is int:
            try:
                return int(text)
            except ValueError:
                number = float(text)  # "1e3" -> 1000
                if number.is_integer():
                    return int(number)
        if member is float:
            return float(text)
    except ValueError:
        pass
    raise _Mismatch


def _as_member(value: Any, member: Any) -> Any:
    """`value` as it is when it fits `member` (converted where the type allows), else
    `_Mismatch`. Strings are parsed by `_parse_str`, in a second pass."""
    origin = typing.get_origin(member)
    if member is Any or member is typing.Any:
        return value
    if member is type(None):
        if value is None:
            return None
    elif member is bool:
        if isinstance(value, bool):
            return value
    elif member is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif member is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif member is str:
        if isinstance(value, str):
            return value
    elif origin is Literal:
        if any(value == a and type(value) is type(a) for a in typing.get_args(member)):
            return value
    elif isinstance(member, type) and issubclass(member, enum.Enum):
        if isinstance(value, member) or value in {m.value for m in member}:
            return value
    elif origin in (list, tuple):
        if isinstance(value, (list, tuple)):
            (item,) = typing.get_args(member)[:1] or (Any,)
            return [_coerce(v, item) for v in value]
    elif origin is dict or member is dict:
        if isinstance(value, dict):
            return value
    else:
        return value  # a type this module does not check (a dataclass, a class): unchanged
    raise _Mismatch


def _coerce(value: Any, annotation: Any) -> Any:
    """`value` fitted to `annotation`: as it is, else converted from a string; else `_Mismatch`."""
    members = _members(annotation)
    for member in members:
        try:
            return _as_member(value, member)
        except _Mismatch:
            pass
    if isinstance(value, str):
        for member in members:
            try:
                return _parse_str(value, member)
            except _Mismatch:
                pass
    raise _Mismatch


def describe(annotation: Any) -> str:
    """The type in words: "a number", "an integer or null", "one of 'a', 'b'"."""
    words = []
    for member in _members(annotation):
        origin = typing.get_origin(member)
        if member is type(None):
            words.append("null")
        elif member in (bool, int, float, str):
            words.append(
                {bool: "true or false", int: "an integer", float: "a number"}.get(
                    member, "a string"
                )
            )
        elif origin is Literal:
            words.append("one of " + ", ".join(repr(a) for a in typing.get_args(member)))
        elif isinstance(member, type) and issubclass(member, enum.Enum):
            words.append("one of " + ", ".join(repr(m.value) for m in member))
        elif origin in (list, tuple):
            words.append(f"a list of {describe(typing.get_args(member)[0])}")
        elif origin is dict or member is dict:
            words.append("a mapping")
        else:
            words.append(getattr(member, "__name__", str(member)))
    unique = list(dict.fromkeys(words))
    return " or ".join(unique)


def coerce_value(name: str, value: Any, field: FieldType) -> Any:
    """One recipe value fitted to its field, or ValueError: one line naming the field."""
    if value is None and field.default_none:
        return None
    try:
        return _coerce(value, field.annotation)
    except _Mismatch:
        pass
    hint = ""
    if isinstance(value, bool):
        hint = " (YAML reads yes/no/on/off/true/false as a boolean)"
    raise ValueError(f"{name} must be {describe(field.annotation)}, got {value!r}{hint}.")


def coerce_values(raw: dict[str, Any], fields: dict[str, FieldType], skip=()) -> dict[str, Any]:
    """`raw` with every value of a known field fitted to its type (`skip`: fields checked
    elsewhere); the first value that does not fit raises ValueError."""
    return {
        key: coerce_value(key, value, fields[key]) if key in fields and key not in skip else value
        for key, value in raw.items()
    }
