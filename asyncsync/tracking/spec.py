"""``--track`` specs: ``tensorboard=DIR``, ``mlflow[=URI]``, ``wandb[=PROJECT]``."""

from __future__ import annotations

from collections.abc import Iterable
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
