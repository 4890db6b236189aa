"""Journal JSON document room: a dataclass as a JSON object, field by field, and back by its
fields' types. Pure; standard library only (the writer process imports it).

The one codec for what the journal's code writes as JSON: the run's events, as the
``events`` table stores their data (records.py), and every frame of the writer link
(messages.py). Nothing is listed twice: the fields are the document.

Written (``doc``, ``to_json``): a dataclass is an object of its fields by name; a tuple or
a list is a list, an enum its value, a ``datetime`` its ISO form, a path its text; a mapping
whose keys are all text an object, any other (tuple keys) a list of ``[key, value]`` pairs;
a type that has a document of its own (``to_doc``/``from_doc``: ``Fold``, which sends what
soakd applies, not its fields) writes that. Anything else is written as its text, as
``json.dumps(default=str)`` does (a log event's fields).

Read (``from_doc``, ``read``), by each field's type: a key the document lacks takes the
field's default (ValueError when it has none), a key the class does not know is left; a
bool, int, float or str must be one (an int is a float too); an enum is read by its value
(ValueError when this soakd does not know it); ``X | None``, tuples (``tuple[X, ...]`` or
fixed), lists, dicts (an object, or a list of pairs), nested dataclasses, ``Literal`` and
``Json`` (as it is). A value of the wrong type is TypeError.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, TypeVar, Union

Json = str | int | float | bool | None | list["Json"] | dict[str, "Json"]
"""A JSON value, as ``json.loads`` gives it."""

T = TypeVar("T")
_Field = tuple[str, object, bool]  # name, type hint, required (no default)
_FIELDS: dict[type, tuple[_Field, ...]] = {}
_NAMES: dict[type, tuple[str, ...]] = {}
_JSON_SCALARS = {str, int, float, bool, type(None)}
_MAPPINGS = (dict, Mapping)
_SEQUENCES = (list, Sequence)


def doc(
    obj: object, omit_none: Collection[str] = (), leave: Collection[str] = ()
) -> dict[str, Json]:
    """A dataclass as its JSON object: every field by name (those in ``omit_none`` are left
    out while they are None, those in ``leave`` always)."""
    cls = type(obj)
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(f.name for f in dataclasses.fields(typing.cast(Any, obj)))
    out: dict[str, Json] = {}
    for name in names:
        value = getattr(obj, name)
        if (value is None and name in omit_none) or name in leave:
            continue
        out[name] = to_json(value)
    return out


def to_json(value: object) -> Json:
    """A value as JSON (see the module's doc)."""
    if isinstance(value, enum.Enum):
        return to_json(value.value)
    if value is None or isinstance(value, str | int | float):  # a bool is an int
        return value
    own = getattr(type(value), "to_doc", None)
    if own is not None:
        return typing.cast(Json, own(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return doc(value)
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if isinstance(value, Mapping):
        if all(isinstance(k, str) for k in value):
            return {k: to_json(v) for k, v in value.items()}
        return [[to_json(k), to_json(v)] for k, v in value.items()]
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)  # a path, an exception in a log event's fields...


def from_doc(cls: type[T], data: Mapping[str, object]) -> T:
    """The dataclass ``cls`` read from its JSON object; ValueError (a field missing, a value
    out of its enum) or TypeError (a value of another type) when it is not one."""
    args: dict[str, object] = {}
    for name, hint, required in _fields(cls):
        if name in data:
            args[name] = read(hint, data[name], name)
        elif required:
            raise ValueError(f"{cls.__name__}: no {name}")
    return cls(**args)


def _fields(cls: type) -> tuple[_Field, ...]:
    got = _FIELDS.get(cls)
    if got is None:
        hints = typing.get_type_hints(cls)
        got = _FIELDS[cls] = tuple(
            (
                f.name,
                hints[f.name],
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
            )
            for f in dataclasses.fields(cls)
            if f.init
        )
    return got


@functools.cache
def _is_json(hint: object) -> bool:
    """``hint`` is ``Json`` (``typing.get_type_hints`` rebuilds the alias in a field's type:
    a union of the JSON scalars, a list and a dict)."""
    if hint is Json:
        return True
    if not isinstance(hint, types.UnionType):
        return False
    args = typing.get_args(hint)
    scalars = {a for a in args if isinstance(a, type)}
    origins = {typing.get_origin(a) for a in args} - {None}
    return scalars == _JSON_SCALARS and origins == {list, dict}


def read(hint: object, value: object, name: str) -> Any:
    """``value`` (JSON) as the type ``hint`` (see the module's doc)."""
    if hint is Any or hint is object or _is_json(hint):
        return value
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is Union or isinstance(hint, types.UnionType):
        if value is None and type(None) in args:
            return None
        for option in args:
            if option is not type(None):
                try:
                    return read(option, value, name)
                except TypeError:
                    continue
    elif origin is Literal:
        if any(value == a and type(value) is type(a) for a in args):
            return value
    elif origin is typing.Annotated:
        return read(args[0], value, name)
    elif origin is tuple and isinstance(value, list | tuple):
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(read(args[0], v, name) for v in value)
        if len(args) == len(value):
            return tuple(read(a, v, name) for a, v in zip(args, value, strict=True))
    elif origin in _SEQUENCES and isinstance(value, list | tuple):
        return [read(args[0], v, name) for v in value]
    elif origin in _MAPPINGS:
        return _mapping(args, value, name)
    elif isinstance(hint, type):
        return _scalar(hint, value, name)
    raise TypeError(f"{name}: {value!r} is not {hint}")


def _mapping(args: tuple[object, ...], value: object, name: str) -> dict[Any, Any]:
    key, item = args
    if isinstance(value, Mapping):
        return {read(key, k, name): read(item, v, name) for k, v in value.items()}
    if isinstance(value, list | tuple) and all(
        isinstance(p, list | tuple) and len(p) == 2 for p in value
    ):
        return {read(key, k, name): read(item, v, name) for k, v in value}
    raise TypeError(f"{name}: {value!r} is not a mapping")


def _scalar(hint: type, value: object, name: str) -> Any:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = number and isinstance(value, int)
    elif hint is float:
        if number:
            return float(typing.cast(float, value))
        ok = False
    elif hint is str:
        ok = isinstance(value, str)
    elif issubclass(hint, enum.Enum):
        if isinstance(value, str) or (number and isinstance(value, int)):
            return hint(value)
        ok = False
    elif hint is datetime:
        if isinstance(value, str):
            return datetime.fromisoformat(value)
        ok = False
    elif hasattr(hint, "from_doc"):
        return hint.from_doc(value)
    elif dataclasses.is_dataclass(hint) and isinstance(value, Mapping):
        return from_doc(hint, value)
    else:
        ok = False
    if not ok:
        raise TypeError(f"{name}: {value!r} is not {hint.__name__}")
    return value
