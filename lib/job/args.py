"""Decode a job's JSON args into the dataclass its handler declares."""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from typing import Any, TypeVar, Union

T = TypeVar("T")


class ArgsError(ValueError):
    """The args do not fit the handler's declared shape; the message names the field."""


def unmarshal_args(cls: type[T], raw: Any, *, strict: bool = False) -> T:
    """cls(**args), checked field by field.

    Keys the dataclass does not declare are ignored, as the original service's
    decoder did: a producer deployed before its consumer must not break it.
    They are named in any ArgsError, where a misspelt key is the likely
    cause; strict (a person typing args at the command line) refuses them.
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    if isinstance(raw, str | bytes):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise ArgsError(f"args are not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ArgsError(f"args must be a JSON object, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init]
    unknown = [key for key in raw if key not in {f.name for f in fields}]
    values: dict[str, Any] = {}
    for field in fields:
        if field.name not in raw:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise ArgsError(f"{cls.__name__}: missing field {field.name!r}{_unknown(unknown, fields)}")
            continue
        value = raw[field.name]
        if not _fits(value, hints[field.name]):
            raise ArgsError(
                f"{cls.__name__}: field {field.name!r} should be {_name(hints[field.name])}, "
                f"got {type(value).__name__} {value!r:.80}{_unknown(unknown, fields)}"
            )
        values[field.name] = value
    if strict and unknown:
        raise ArgsError(f"{cls.__name__}: {_unknown(unknown, fields).removeprefix('; ')}")
    return cls(**values)


def _unknown(keys: list[str], fields: list[dataclasses.Field]) -> str:
    """The keys the dataclass does not declare, each with the field it is
    nearest to (a misspelling), as a clause to append; "" for none. With no
    near field, the fields it has."""
    if not keys:
        return ""
    names = [f.name for f in fields]
    shown = []
    for key in keys[:5]:
        near = difflib.get_close_matches(str(key), names, n=1)
        shown.append(f"{key!r:.60}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    more = f" and {len(keys) - 5} more" if len(keys) > 5 else ""
    listed = "" if any("did you mean" in k for k in shown) else f" (its fields: {', '.join(names) or 'none'})"
    return f"; unknown {'key' if len(keys) == 1 else 'keys'} {', '.join(shown)}{more}{listed}"


def _fits(value: Any, hint: Any) -> bool:
    """Whether a decoded JSON value fits a simple annotation; anything richer
    than JSON's own types is accepted as is."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if origin in (Union, types.UnionType):
        return any(_fits(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint in (str, bool):
        return isinstance(value, hint)
    if hint is list or origin is list:
        return isinstance(value, list)
    if hint is dict or origin is dict:
        return isinstance(value, dict)
    return True


def _name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint)
