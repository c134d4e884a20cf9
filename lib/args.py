"""Decode a job's JSON args into the dataclass its handler declares."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, TypeVar, Union

T = TypeVar("T")


class ArgsError(ValueError):
    """The args do not fit the handler's declared shape; the message names the field."""


def unmarshal_args(cls: type[T], raw: Any) -> T:
    """cls(**args), checked field by field.

    Keys the dataclass does not declare are ignored, as the original service's
    decoder did: a producer deployed before its consumer must not break it.
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
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        if field.name not in raw:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise ArgsError(f"{cls.__name__}: missing field {field.name!r}")
            continue
        value = raw[field.name]
        if not _fits(value, hints[field.name]):
            raise ArgsError(
                f"{cls.__name__}: field {field.name!r} should be {_name(hints[field.name])}, "
                f"got {type(value).__name__} {value!r:.80}"
            )
        values[field.name] = value
    return cls(**values)


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
