"""What a tracker is told about a run, and the protocol every adapter follows."""

from __future__ import annotations

import contextlib
import importlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol, TypeVar

from asyncsync.schema import ConfigError


class TrackingError(ConfigError):
    """A tracker that cannot be used: a bad ``--track`` spec or a missing package."""


T = TypeVar("T")


@dataclass(frozen=True)
class RunInfo:
    """One run as the trackers see it.

    Attributes:
        run_id: stable id, ``<recipe>/<study stamp>/<run folder>``: the same run exported
            twice maps to the same tracked run.
        recipe: the recipe's name.
        stamp: the study's timestamp folder.
        name: the run's name in the recipe, sweep point included (repeats share it).
        repeat: the repeat's index.
        seed: the repeat's seed.
        clock: ``real`` or ``virtual``: what the run's seconds are.
        start_wall: epoch seconds at which the run started (its recipe.json was written).
        config: the run's resolved settings, flattened to dotted keys.
        sweep: the sweep point, ``{}`` outside a sweep.
    """

    run_id: str
    recipe: str
    stamp: str
    name: str
    repeat: int
    seed: int
    clock: str
    start_wall: float
    config: dict[str, Any] = field(default_factory=dict)
    sweep: dict[str, Any] = field(default_factory=dict)

    @property
    def group(self) -> str:
        """What the repeats of one run share: ``<recipe>/<stamp>/<name>``."""
        return f"{self.recipe}/{self.stamp}/{self.name}"

    def slug(self) -> str:
        """The run id in letters, digits, ``-`` and ``_`` only (for ids with a charset)."""
        return re.sub(r"[^A-Za-z0-9_-]+", "-", self.run_id).strip("-")


@dataclass(frozen=True)
class Point:
    """One evaluation of the global model.

    Attributes:
        step: the server's model version when it was evaluated.
        time_s: the run's time (virtual or real seconds since its start).
        metrics: the values: ``accuracy``, ``loss``, workers' compute proportions, bytes.
    """

    step: int
    time_s: float
    metrics: dict[str, float]


class Tracker(Protocol):
    """Receives runs: ``start``, ``log`` per evaluation, ``finish``, each call naming its run.

    Several runs may be open at once (a study's parallel runs share one tracker), so a
    tracker keeps its state per ``run.run_id``; calls come one at a time (`RunFeed`
    serializes them). A tracker may have a ``label`` (``tracking to mlflow at URI``) by
    which errors name it; one without goes by its class's name.
    """

    def start(self, run: RunInfo) -> None:
        """Open (or reopen, for the same ``run.run_id``) the run's tracked record."""

    def log(self, run: RunInfo, point: Point, wall: float) -> None:
        """Record one evaluation of `run`; `wall` is its wall clock (epoch seconds)."""

    def finish(self, run: RunInfo, summary: dict[str, float], step: int) -> None:
        """Record `run`'s summary figures at its last `step`, and close it."""

    def close(self) -> None:
        """Flush and release everything (after the last run)."""


def label(tracker: object) -> str:
    """How errors name `tracker`: its ``label``, else its class's name."""
    given = getattr(tracker, "label", None)
    return given if isinstance(given, str) else type(tracker).__name__


@contextlib.contextmanager
def naming(tracker: object, call: str, run: RunInfo) -> Iterator[None]:
    """Turn what `tracker`'s `call` of `run` raises into one line naming the tracker, the
    call, the run and the cause (its type and message); a `TrackingError`, which names its
    tool already, goes as it is.

    Raises:
        TrackingError: the call failed.
    """
    try:
        yield
    except TrackingError:
        raise
    except Exception as exc:
        cause = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise TrackingError(f"{label(tracker)}: could not {call} run {run.run_id}: "
                            f"{cause}") from exc


def require(module: str, package: str) -> ModuleType:
    """Import `module` of an optional `package`, or fail with one line on what to install.

    Raises:
        TrackingError: the package is not installed.
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise TrackingError(f"tracking to {package} needs the {package} package: "
                            "pip install asyncsync[track]") from None


def flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested tables as one level of dotted keys (``stop.time_s``); empty tables dropped."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def opened(runs: Mapping[str, T], run: RunInfo, tool: str) -> T:
    """What tracker `tool` keeps for `run` since its ``start`` (trackers keep one entry per
    run, so parallel runs each have their own).

    Raises:
        TrackingError: `run` was not started (``log`` or ``finish`` before ``start``).
    """
    try:
        return runs[run.run_id]
    except KeyError:
        raise TrackingError(f"{tool}: {run.run_id}: log() or finish() before start()") from None
