"""``--track`` specs: ``tensorboard=DIR``, ``mlflow[=URI]``, ``wandb[=PROJECT]``."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping
from pathlib import Path

from asyncsync.tracking.base import Tracker, TrackingError

DEFAULTS = {"tensorboard": "runs", "mlflow": "mlruns", "wandb": "asyncsync"}
"""Where a spec without ``=`` writes: TensorBoard's and MLflow's usual folders, a W&B
project."""


def parse_track(spec: str) -> Tracker:
    """The tracker a ``--track`` spec names (its package imported only now).

    ``tensorboard=DIR`` writes event files under DIR; ``mlflow=URI`` logs to a tracking URI
    or, for a plain path, a file store in that folder; ``wandb=PROJECT`` logs offline to W&B
    under ``./wandb`` (``WANDB_MODE`` chooses another mode).

    Raises:
        TrackingError: an unknown tool, or its package is missing.
    """
    tool, _, where = spec.partition("=")
    tool = tool.strip().lower()
    where = where.strip() or DEFAULTS.get(tool, "")
    if tool == "tensorboard":
        from asyncsync.tracking.tensorboard_tracker import TensorBoardTracker

        return TensorBoardTracker(Path(where))
    if tool == "mlflow":
        from asyncsync.tracking.mlflow_tracker import MlflowTracker

        return MlflowTracker(where)
    if tool == "wandb":
        from asyncsync.tracking.wandb_tracker import WandbTracker

        return WandbTracker(where)
    raise TrackingError(f"--track {spec}: expected tensorboard[=DIR] (default "
                        f"{DEFAULTS['tensorboard']}), mlflow[=URI] (default "
                        f"{DEFAULTS['mlflow']}) or wandb[=PROJECT] (default "
                        f"{DEFAULTS['wandb']})")


def unique_specs(specs: Iterable[str]) -> list[str]:
    """`specs` without those that name a place an earlier one names (``tensorboard`` and
    ``tensorboard=runs/``, a recipe's ``[tracking]`` given again with ``--track``): two
    trackers of one place would each start the same runs there."""
    seen, kept = set(), []
    for spec in specs:
        tool, _, where = spec.partition("=")
        tool = tool.strip().lower()
        where = where.strip() or DEFAULTS.get(tool, "")
        place = (tool, str(Path(where)) if tool == "tensorboard" else where)
        if place not in seen:
            seen.add(place)
            kept.append(spec)
    return kept


def missing_package(spec: str) -> str:
    """What the tool of tracker `spec` lacks here: its package, said with what to install
    ("" when it is installed, or the tool is unknown, which `parse_track` names)."""
    tool = spec.partition("=")[0].strip().lower()
    if tool in DEFAULTS and importlib.util.find_spec(tool) is None:
        return f"needs the {tool} package: pip install asyncsync[track]"
    return ""


def refuse_missing(track: Iterable[str], tracking: Mapping[str, str], recipe: str) -> None:
    """Refuse the trackers whose package is missing before anything runs, each named where
    it was asked for: a ``--track`` spec of `track`, or a key of `recipe`'s ``[tracking]``.

    Raises:
        TrackingError: a tracker's package is not installed.
    """
    for tool in tracking:
        if problem := missing_package(tool):
            raise TrackingError(f"{recipe}: tracking.{tool}: {problem}")
    for spec in track:
        if problem := missing_package(spec):
            raise TrackingError(f"--track {spec}: {problem}")
