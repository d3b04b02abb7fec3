"""MLflow through ``MlflowClient``, on a local store (a folder) by default.

A run goes to the experiment named after its recipe, named ``<stamp>/<run>/r<repeat>``,
tagged with its run id (``asyncsync.run_id``), its group (``asyncsync.group``: what its
repeats share) and its seed. Exporting a run again finds it by that tag and adds only what
it lacks, so a run is never tracked twice.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from asyncsync.tracking.base import Point, RunInfo, opened, require

BATCH = 100
"""Params per ``log_batch`` call (MLflow's limit)."""


def store_uri(where: str) -> str:
    """A tracking URI: `where` itself if it has a scheme, else a local store in that folder.

    The local store is MLflow's SQLite one (``<folder>/mlflow.db``): MLflow 3 refuses its
    plain-file store unless ``MLFLOW_ALLOW_FILE_STORE=true`` (then pass a ``file:`` URI).
    """
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", where):
        return where
    folder = Path(where).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'mlflow.db'}"


class MlflowTracker:
    """Logs each run to the MLflow tracking store at `uri`."""

    def __init__(self, uri: str) -> None:
        mlflow = require("mlflow", "mlflow")
        self._entities = require("mlflow.entities", "mlflow")
        self.label = f"tracking to mlflow at {store_uri(uri)}"
        self.client = mlflow.MlflowClient(tracking_uri=store_uri(uri))
        self._open_runs: dict[str, str] = {}  # asyncsync run id -> MLflow run id
        self._skip: dict[str, int] = {}  # evaluations MLflow already has, per run

    def find(self, run: RunInfo) -> Any:
        """The tracked MLflow run of `run`, or None."""
        experiment = self.client.get_experiment_by_name(run.recipe)
        if experiment is None:
            return None
        found = self.client.search_runs(
            [experiment.experiment_id],
            filter_string=f"tags.`asyncsync.run_id` = '{run.run_id}'", max_results=1)
        return found[0] if found else None

    def start(self, run: RunInfo) -> None:
        """Reopen the run's tracked run, or create it with its settings as params."""
        existing = self.find(run)
        if existing is not None:
            self._open_runs[run.run_id] = existing.info.run_id
            self._skip[run.run_id] = len(self.client.get_metric_history(
                existing.info.run_id, "accuracy"))
            return
        experiment = self.client.get_experiment_by_name(run.recipe)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else self.client.create_experiment(run.recipe))
        tags = {"asyncsync.run_id": run.run_id, "asyncsync.group": run.group,
                "recipe": run.recipe, "run": run.name, "repeat": str(run.repeat),
                "seed": str(run.seed), "clock": run.clock}
        created = self.client.create_run(experiment_id, tags=tags,
                                         run_name=f"{run.stamp}/{run.name}/r{run.repeat}",
                                         start_time=round(run.start_wall * 1000))
        run_id = self._open_runs[run.run_id] = created.info.run_id
        self._skip[run.run_id] = 0
        params = [self._entities.Param(key, json.dumps(value) if not isinstance(value, str)
                                       else value) for key, value in run.config.items()]
        for at in range(0, len(params), BATCH):
            self.client.log_batch(run_id, params=params[at:at + BATCH])

    def log(self, run: RunInfo, point: Point, wall: float) -> None:
        """The point's metrics at its version, stamped with `wall` (skipped if already there)."""
        run_id = opened(self._open_runs, run, "mlflow")
        if self._skip[run.run_id]:
            self._skip[run.run_id] -= 1
            return
        stamp = round(wall * 1000)
        self.client.log_batch(run_id, metrics=[
            self._entities.Metric(key, value, stamp, point.step)
            for key, value in point.metrics.items()])

    def finish(self, run: RunInfo, summary: dict[str, float], step: int) -> None:
        """The summary's figures as ``summary/<key>`` (those that changed); ends the run."""
        run_id = opened(self._open_runs, run, "mlflow")
        have = self.client.get_run(run_id).data.metrics
        changed = [(f"summary/{key}", value) for key, value in summary.items()
                   if have.get(f"summary/{key}") != value]
        if changed:
            stamp = self.client.get_run(run_id).info.start_time
            self.client.log_batch(run_id, metrics=[
                self._entities.Metric(key, value, stamp, step) for key, value in changed])
        self.client.set_terminated(run_id, "FINISHED")
        del self._open_runs[run.run_id], self._skip[run.run_id]

    def close(self) -> None:
        """Forget the runs left open (MLflow holds nothing open between calls)."""
        self._open_runs.clear()
        self._skip.clear()
