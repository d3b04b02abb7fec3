"""Runs in the tools researchers already use: TensorBoard, MLflow and W&B, fed from the logs.

`export_study` sends a finished study; `follow` streams a run while the supervisor runs it;
`parse_track` turns a ``--track`` spec into a tracker. Each tool's package is imported only
when its tracker is made (``pip install asyncsync[track]``).
"""

from asyncsync.tracking.base import Point, RunInfo, Tracker, TrackingError
from asyncsync.tracking.feed import RunFeed, export_runs, export_study, follow
from asyncsync.tracking.spec import parse_track, refuse_missing, unique_specs

__all__ = ["Point", "RunFeed", "RunInfo", "Tracker", "TrackingError", "export_runs",
           "export_study", "follow", "parse_track", "refuse_missing", "unique_specs"]
