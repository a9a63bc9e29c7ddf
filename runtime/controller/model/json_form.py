"""Frozen dataclasses as JSON objects, with each unit converted once, here.

A :class:`JsonRecord` writes each field under its name, nested records as objects, lists and dicts item by item;
a field whose metadata is :func:`in_ms` or :func:`in_pct` holds seconds or a fraction and is written under the
key it names, times 1000 or 100 (every number in it: a nested record, a list). :meth:`JsonRecord.from_json`
reads such an object back (dividing again), and raises :class:`JsonFormError` on a missing or unknown key.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, Self

from kdvfs.common.errors import KdvfsError
from kdvfs.common.units import MS_PER_S, PCT_PER_FRACTION


class JsonFormError(KdvfsError):
    """A JSON object that is not the record it should be (a key missing or unknown)."""


def named(key: str) -> dict[str, Any]:
    """The metadata of a field written under another key: ``field(metadata=named("controller_cpu_ms"))``."""
    return {"json": (key, 1.0)}


def in_ms(key: str) -> dict[str, Any]:
    """The metadata of a field of seconds written as milliseconds under ``key``:
    ``late_s: float = field(metadata=in_ms("late_ms"))``."""
    return {"json": (key, MS_PER_S)}


def in_pct(key: str) -> dict[str, Any]:
    """The metadata of a field of fractions written as percent under ``key``:
    ``step_budget: float = field(metadata=in_pct("step_budget_pct"))``."""
    return {"json": (key, PCT_PER_FRACTION)}


def _key(field: dataclasses.Field[Any]) -> tuple[str, float]:
    return field.metadata.get("json", (field.name, 1.0))


def _written(value: Any, scale: float) -> Any:
    if isinstance(value, JsonRecord):
        return {key: _written(item, scale) for key, item in value.to_json().items()}
    if isinstance(value, list | tuple):
        return [_written(item, scale) for item in value]
    if isinstance(value, dict):
        return {key: _written(item, scale) for key, item in value.items()}
    if scale != 1.0 and isinstance(value, int | float) and not isinstance(value, bool):
        return value * scale
    return value


def _read(kind: Any, value: Any, scale: float) -> Any:
    origin, arguments = typing.get_origin(kind), typing.get_args(kind)
    if value is None or kind is Any:
        return value
    if origin in (typing.Union, types.UnionType):  # ``X | None`` (None is handled above)
        (inner,) = (a for a in arguments if a is not type(None))
        return _read(inner, value, scale)
    if isinstance(kind, type) and issubclass(kind, JsonRecord):
        return kind.from_json(value, scale)
    if origin is list:
        return [_read(arguments[0], item, scale) for item in value]
    if origin is dict:
        return {key: _read(arguments[1], item, scale) for key, item in value.items()}
    if scale != 1.0 and kind is float:
        return value / scale
    return value


class JsonRecord:
    """A frozen dataclass written and read as one JSON object (see the module docstring)."""

    def to_json(self) -> dict[str, Any]:
        """This record as a JSON object (keys in field order)."""
        return {key: _written(getattr(self, field.name), scale)
                for field in dataclasses.fields(self) for key, scale in [_key(field)]}  # type: ignore[arg-type]

    @classmethod
    def from_json(cls, document: Mapping[str, Any], scale: float = 1.0) -> Self:
        """The record :meth:`to_json` wrote (numbers written times ``scale`` divided back).

        Raises:
            JsonFormError: ``document`` lacks one of the record's keys or has another.
        """
        if not isinstance(document, Mapping):
            raise JsonFormError(f"{cls.__name__}: {document!r} is not a JSON object")
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        keys = {_key(field)[0]: field for field in fields}
        unknown, missing = set(document) - set(keys), set(keys) - set(document)
        if unknown or missing:
            raise JsonFormError(f"{cls.__name__}: " + "; ".join(
                part for part in (unknown and f"unknown key(s) {sorted(unknown)}",
                                  missing and f"missing key(s) {sorted(missing)}") if part))
        hints = typing.get_type_hints(cls)
        return cls(**{field.name: _read(hints[field.name], document[key], scale * factor)
                      for key, field in keys.items() for factor in [_key(field)[1]]})
