"""Typed configuration: build frozen dataclasses from TOML tables with precise errors.

Every error names the dotted key and the problem (``runs[1].stop.time_s: must be > 0, got
-5``). Fields declare value checks with `option(default, check, rule)`. Every number is
finite: TOML's ``inf`` and ``nan`` are refused whatever the field (a budget, a delay or a
slowdown of ``inf`` would make a run wait forever; a large finite value says what is meant).
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from asyncsync.errors import InputError

T = TypeVar("T")


class ConfigError(InputError, ValueError):
    """A configuration value is missing, unknown or ill-typed; the message names the key."""


def option(default: Any, check: Callable[[Any], bool] | None = None, rule: str = "",
           help: str = "", internal: bool = False) -> Any:
    """A dataclass field with a default, an optional value check and a help line;
    `internal`: set by the program, not offered in the known keys of an error."""
    kwargs: dict[str, Any] = {"metadata": {"check": check, "rule": rule, "help": help,
                                           "internal": internal}}
    if isinstance(default, list | dict):
        kwargs["default_factory"] = lambda: type(default)(default)
    else:
        kwargs["default"] = default
    return dataclasses.field(**kwargs)


def from_mapping(cls: type[T], data: Mapping[str, Any], path: str,
                 where: Callable[[str], str] | None = None) -> T:
    """Build dataclass `cls` from `data`; `where(key)` maps a dotted key to its origin."""
    locate = where or (lambda key: f"{path}.{key}" if path else key)
    if not isinstance(data, Mapping):
        raise ConfigError(f"{locate('') or path}: expected a table, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = get_type_hints(cls)
    not_offered: Mapping[str, str] = getattr(cls, "NOT_OFFERED", {})
    for key in data:
        if key in not_offered:  # a key the class names as refused, with the reason
            raise ConfigError(f"{locate(key)}: {not_offered[key]}")
        if key not in fields:
            known = ", ".join(name for name, f in fields.items()
                              if not f.metadata.get("internal")) or "none"
            raise ConfigError(f"{locate(key)}: unknown key (known: {known})")
    values: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in data:
            continue
        value = _convert(hints[name], data[name], name, locate)
        if problem := _infinite_or_nan(value):
            raise ConfigError(f"{locate(name)}: {problem}")
        check = f.metadata.get("check")
        if check is not None and not check(value):
            raise ConfigError(f"{locate(name)}: {f.metadata['rule']}, got {value!r}")
        values[name] = value
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{locate('').rstrip('.') or path}: {exc}") from exc


def _infinite_or_nan(value: Any) -> str:
    """What is wrong with a number, or the first wrong number of a list, that is not finite
    ("" when none is): checked before a field's rule, which a NaN fails without saying why."""
    if isinstance(value, float) and math.isnan(value):
        return "must be a number, got nan (not a number; write the value meant)"
    if isinstance(value, float) and math.isinf(value):
        return f"must be a finite number, got {value!r} (write a large finite value instead)"
    if isinstance(value, list):
        return next(filter(None, map(_infinite_or_nan, value)), "")
    return ""


def _convert(kind: Any, value: Any, key: str, locate: Callable[[str], str]) -> Any:
    origin = get_origin(kind)
    if origin in (Union, types.UnionType):
        options = get_args(kind)
        if value is None and type(None) in options:
            return None
        errors = []
        for option_type in options:
            if option_type is type(None):
                continue
            try:
                return _convert(option_type, value, key, locate)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0])
    if dataclasses.is_dataclass(kind) and isinstance(kind, type):
        return from_mapping(kind, value, "", lambda sub: locate(f"{key}.{sub}".rstrip(".")))
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{locate(key)}: expected a list, got {value!r}")
        (item,) = get_args(kind)
        return [_convert(item, v, f"{key}[{i}]", locate) for i, v in enumerate(value)]
    if origin is dict or kind is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{locate(key)}: expected a table, got {value!r}")
        return dict(value)
    if kind is Any:
        return value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind in (int, float, str, bool) and isinstance(value, dict) and value:
        # a dotted key one level too deep (a sweep's or --set's stop.time_s.x) makes a table
        raise ConfigError(f"{locate(key)}: expected {kind.__name__}, got a table {value!r}: "
                          f"there is no key {locate(key)}.{next(iter(value))}")
    if kind in (int, float, str, bool) and (
        not isinstance(value, kind) or (kind is not bool and isinstance(value, bool))
    ):
        raise ConfigError(f"{locate(key)}: expected {kind.__name__}, got {value!r}")
    return value


def describe(cls: type[Any]) -> list[tuple[str, Any, str]]:
    """``(name, default, help)`` for each field of a parameter dataclass, less those it
    inherits but refuses (named in its ``REFUSED_OPTIONS``)."""
    refused: frozenset[str] = getattr(cls, "REFUSED_OPTIONS", frozenset())
    out = []
    for f in dataclasses.fields(cls):
        if f.name in refused:
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        out.append((f.name, default, f.metadata.get("help", "")))
    return out


def check_fields(obj: Any) -> None:
    """Run the `option` checks of a dataclass instance (call it from ``__post_init__``)."""
    for f in dataclasses.fields(obj):
        check = f.metadata.get("check")
        value = getattr(obj, f.name)
        if check is not None and not check(value):
            raise ValueError(f"{f.name}: {f.metadata['rule']}, got {value!r}")
