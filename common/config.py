"""Strict YAML -> frozen dataclass loading shared by every kdvfs config (GPU profiles, training configs).

Unknown keys, missing keys and wrong types are errors that name the file and the key path.
Supported field types: ``int``, ``float``, ``str``, ``bool``, ``X | None``, ``tuple[X, ...]``,
``dict[K, V]`` (stored read-only) and nested frozen dataclasses.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from kdvfs.common.errors import KdvfsError
from kdvfs.common.frozen import frozen

T = TypeVar("T")


class ConfigError(KdvfsError):
    """A YAML config is unreadable or does not match its schema."""


def _fail(where: str, key: str, message: str) -> typing.NoReturn:
    raise ConfigError(f"{where}: {key or '<top>'}: {message}")


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _convert(value: Any, kind: Any, where: str, key: str) -> Any:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(value, inner[0], where, key)
    if dataclasses.is_dataclass(kind):
        return from_mapping(kind, value, where, key)  # type: ignore[arg-type]
    if origin is tuple:
        if not isinstance(value, list | tuple):
            _fail(where, key, f"expected a list, got {value!r}")
        item_types = [args[0]] * len(value) if args[-1] is Ellipsis else list(args)
        if len(item_types) != len(value):
            _fail(where, key, f"expected {len(item_types)} values, got {len(value)}")
        pairs = enumerate(zip(value, item_types, strict=True))
        return tuple(_convert(v, t, where, f"{key}[{i}]") for i, (v, t) in pairs)
    if origin in (dict, collections.abc.Mapping) or kind is dict:
        if not isinstance(value, dict):
            _fail(where, key, f"expected a mapping, got {value!r}")
        key_type, value_type = args or (str, Any)
        return frozen({
            _convert(k, key_type, where, f"{key}.{k}"): _convert(v, value_type, where, f"{key}.{k}")
            for k, v in value.items()
        })
    if kind is Any:
        return value
    if kind is float:
        if isinstance(value, str) and _looks_numeric(value):
            _fail(where, key, f"{value!r} is read as text by YAML; write exponents with a sign (1.0e+12)")
        if isinstance(value, bool) or not isinstance(value, int | float):
            _fail(where, key, f"expected a number, got {value!r}")
        try:
            number = float(value)
        except OverflowError:  # an integer beyond the float range
            number = math.inf
        if not math.isfinite(number):
            _fail(where, key, f"expected a finite number, got {value!r:.40}")
        return number
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(where, key, f"expected an integer, got {value!r}")
        return value
    if kind in (str, bool):
        if not isinstance(value, kind):
            _fail(where, key, f"expected {kind.__name__}, got {value!r}")
        return value
    raise TypeError(f"unsupported config field type {kind!r}")


def from_mapping(cls: type[T], data: Any, where: str, key: str = "") -> T:
    """Build the dataclass ``cls`` from a mapping, strictly (unknown or missing keys are errors)."""
    if not isinstance(data, dict):
        _fail(where, key, f"expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        _fail(where, key, f"unknown key(s) {unknown}; allowed: {sorted(fields)}")
    values = {}
    for name, field in fields.items():
        path = f"{key}.{name}" if key else name
        if name in data:
            values[name] = _convert(data[name], hints[name], where, path)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            _fail(where, path, "missing required key")
    try:
        return cls(**values)
    except KdvfsError as error:
        raise ConfigError(f"{where}: {key or '<top>'}: {error}") from None


def load_yaml(path: Path) -> Any:
    """Read a YAML file with ``yaml.safe_load``; unreadable or invalid YAML is a :class:`ConfigError`."""
    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.safe_load(handle)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise ConfigError(f"{path}: not valid YAML ({str(error).splitlines()[0]})") from None


def merge_mappings(base: Any, override: Any) -> Any:
    """``override`` laid over ``base``: where both are mappings, the result holds ``base``'s keys with each key
    of ``override`` merged in recursively; anywhere else (numbers, text, lists, null) ``override`` replaces
    ``base`` whole. Neither input is modified (mappings in the result are new)."""
    if not (isinstance(base, dict) and isinstance(override, dict)):
        return {k: merge_mappings(None, v) for k, v in override.items()} if isinstance(override, dict) else override
    merged = {key: merge_mappings(None, value) for key, value in base.items()}
    for key, value in override.items():
        merged[key] = merge_mappings(merged.get(key), value)
    return merged


def to_plain(value: Any) -> Any:
    """Turn a config dataclass back into plain YAML-able data (for saving resolved configs)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, typing.Mapping):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [to_plain(v) for v in value]
    return value
