"""TensorBoard event files through ``torch.utils.tensorboard``.

Each run writes ``<dir>/<recipe>/<stamp>/<run>/r<repeat>/``: TensorBoard names runs by
their folder, so a run's repeats sit together. Scalars use the server's version as the
step and the run's start plus its time as the wall clock, so TensorBoard's *Relative* axis
reads in the run's own (virtual or real) seconds. Exporting a run again clears its folder
first.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from asyncsync.tracking.base import Point, RunInfo, TrackingError, require


class TensorBoardTracker:
    """Writes one event-file folder per run under `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._module = require("torch.utils.tensorboard", "tensorboard")
        self._writer: Any = None
        self._start = 0.0

    def run_dir(self, run: RunInfo) -> Path:
        """The folder of `run`'s event files."""
        return self.directory / run.recipe / run.stamp / run.name / f"r{run.repeat}"

    def start(self, run: RunInfo) -> None:
        """Clear the run's folder and open a writer on it, with the settings as text."""
        path = self.run_dir(run)
        if path.exists():
            shutil.rmtree(path)
        self._writer = self._module.SummaryWriter(log_dir=str(path))
        self._start = run.start_wall
        settings = {**run.config, "run_id": run.run_id, "seed": run.seed}
        self._writer.add_text("config", "\n".join(
            f"    {key} = {json.dumps(value)}" for key, value in sorted(settings.items())),
            global_step=0, walltime=self._start)

    def log(self, point: Point, wall: float) -> None:
        """One scalar per metric at the point's version."""
        writer = self._open()
        for key, value in point.metrics.items():
            writer.add_scalar(key, value, global_step=point.step, walltime=wall)

    def finish(self, summary: dict[str, float], step: int) -> None:
        """The summary's figures as ``summary/<key>`` at the last version; closes the run."""
        writer = self._open()
        for key, value in summary.items():
            writer.add_scalar(f"summary/{key}", value, global_step=step)
        writer.close()
        self._writer = None

    def close(self) -> None:
        """Close a run left open."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _open(self) -> Any:
        if self._writer is None:
            raise TrackingError("tensorboard: log() or finish() before start()")
        return self._writer
