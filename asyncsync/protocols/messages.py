"""The SDK's messages and refusals: what a rule receives and answers, and how it says no.

Re-exported by `asyncsync.protocols.base`, where protocol authors import them from.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass, field
from typing import Any

import torch

from asyncsync.schema import check_fields

_BRIEF = reprlib.Repr()
_BRIEF.maxlevel, _BRIEF.maxstring, _BRIEF.maxother = 3, 40, 40


def brief(value: object) -> str:
    """A short, bounded repr of peer data for a refusal's reason (never the whole value:
    a peer may send a list nested a thousand deep)."""
    return _BRIEF.repr(value)


class Refused(Exception):
    """A request the server refuses; it changed nothing. `reason` is one line for the peer."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class BadRequest(Refused):
    """Malformed: a field is missing, of the wrong type or out of range."""


class Unacceptable(Refused):
    """Well formed, but its content is refused (non-finite values, a weight it cannot carry)."""


class Forbidden(Refused):
    """The sender may not do this (an unknown rank, a wrong run)."""


class OutOfStep(Refused):
    """It does not fit the protocol's state (another round, a pull before a push, a push from
    before the worker rejoined); the worker rejoins and restarts its loop."""


class NotInRun(Refused):
    """The worker is not (or no longer) in the run: it was dropped, left, or never joined."""


class RunStopped(Exception):
    """The run is over (the server said stop, or the worker reached its step limit)."""


def require(header: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    """``header[key]`` if it has the given type (a bool is not an int), else `BadRequest`."""
    if key not in header:
        raise BadRequest(f"missing field {key!r}")
    value = header[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        raise BadRequest(f"field {key!r} must be {' or '.join(k.__name__ for k in kinds)}")
    return value


def require_count(header: dict[str, Any], key: str) -> int:
    """A non-negative integer field, else `BadRequest`."""
    value: int = require(header, key, int)
    if value < 0:
        raise BadRequest(f"field {key!r} must be >= 0")
    return value


@dataclass
class Push:
    """A validated push: `vector` is a gradient, a delta or a model, per `kind`."""

    worker: int
    base_version: int
    kind: str
    vector: torch.Tensor
    steps: int
    samples: int
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Pull:
    """A validated pull request."""

    worker: int
    base_version: int
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Reply:
    """What the server answers: protocol `meta`, and a vector with its version for pulls."""

    meta: dict[str, Any] = field(default_factory=dict)
    vector: torch.Tensor | None = None
    version: int | None = None


@dataclass(frozen=True)
class Params:
    """Base of a protocol's parameters: a frozen dataclass of `option` fields, each checked
    when it is made (a subclass with checks across fields overrides `__post_init__` and
    calls ``super().__post_init__()`` first)."""

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class NoParams(Params):
    """For protocols without parameters."""
