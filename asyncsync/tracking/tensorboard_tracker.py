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

from asyncsync.tracking.base import Point, RunInfo, TrackingError, opened, require


class TensorBoardTracker:
    """Writes one event-file folder per run under `directory` (a writer per open run)."""

    def __init__(self, directory: Path) -> None:
        """Make `directory` now, before any run (not in the first run's writer, where its
        failure was masked by the next call).

        Raises:
            TrackingError: the package is missing, or `directory` cannot be made.
        """
        self.directory = directory
        self.label = f"tracking to tensorboard in {directory}"
        self._module = require("torch.utils.tensorboard", "tensorboard")
        self._writers: dict[str, Any] = {}
        try:
            if directory.exists() and not directory.is_dir():
                raise NotADirectoryError(0, "a file, not a folder")
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TrackingError(f"tracking to tensorboard: cannot make the folder "
                                f"{directory} ({exc.strerror or exc})") from None

    def run_dir(self, run: RunInfo) -> Path:
        """The folder of `run`'s event files."""
        return self.directory / run.recipe / run.stamp / run.name / f"r{run.repeat}"

    def start(self, run: RunInfo) -> None:
        """Clear the run's folder and open a writer on it, with the settings as text."""
        path = self.run_dir(run)
        if path.exists():
            shutil.rmtree(path)
        writer = self._module.SummaryWriter(log_dir=str(path))
        self._writers[run.run_id] = writer
        settings = {**run.config, "run_id": run.run_id, "seed": run.seed}
        writer.add_text("config", "\n".join(
            f"    {key} = {json.dumps(value)}" for key, value in sorted(settings.items())),
            global_step=0, walltime=run.start_wall)

    def log(self, run: RunInfo, point: Point, wall: float) -> None:
        """One scalar per metric at the point's version."""
        writer = opened(self._writers, run, "tensorboard")
        for key, value in point.metrics.items():
            writer.add_scalar(key, value, global_step=point.step, walltime=wall)

    def finish(self, run: RunInfo, summary: dict[str, float], step: int) -> None:
        """The summary's figures as ``summary/<key>`` at the last version; closes the run."""
        writer = opened(self._writers, run, "tensorboard")
        for key, value in summary.items():
            writer.add_scalar(f"summary/{key}", value, global_step=step)
        writer.close()
        del self._writers[run.run_id]

    def close(self) -> None:
        """Close the runs left open."""
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
