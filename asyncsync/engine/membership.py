"""Membership: who is in the run, what the server knows of each worker, and rejoins.

The live set is the store's; this module keeps per-worker records (state, losses, last
sign of life, reported totals) and the version each worker last (re)joined at, which is
where the one rule "a push from before this worker rejoined is refused" is enforced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from asyncsync.metrics import STAT_FIELDS
from asyncsync.protocols.base import OutOfStep


@dataclass
class WorkerRecord:
    """What the server knows of one worker."""

    joined: bool = False
    left: bool = False
    lost: int = 0
    nonfinite: int = 0
    last_seen: float = 0.0
    joined_at: int = 0
    state: str = "starting"
    stats: dict[str, float] = field(default_factory=dict)

    def take_stats(self, stats: object) -> None:
        """Keep the worker's reported totals (known, finite numeric fields only)."""
        if isinstance(stats, dict):
            self.stats = {k: float(v) for k, v in stats.items()
                          if k in STAT_FIELDS and isinstance(v, int | float)
                          and not isinstance(v, bool) and math.isfinite(v)}

    def check_base(self, worker: int, base_version: int) -> None:
        """Refuse an update computed before this worker last (re)joined."""
        if base_version < self.joined_at:
            raise OutOfStep(f"update based on version {base_version}, before worker {worker} "
                            f"rejoined at version {self.joined_at}")

    def summary(self, rank: int, waiting: bool) -> dict[str, Any]:
        """The dashboard's view of this worker."""
        stats = self.stats
        wall = stats.get("wall_s", 0.0)
        return {
            "rank": rank, "state": "waiting" if waiting else self.state,
            "steps": int(stats.get("steps", 0)),
            "samples_per_s": stats.get("samples", 0.0) / wall if wall > 0 else 0.0,
            "compute_proportion": stats.get("compute_s", 0.0) / wall if wall > 0 else 0.0,
            "bytes_up": int(stats.get("bytes_up", 0)),
            "bytes_down": int(stats.get("bytes_down", 0)),
            "loss": stats.get("loss", math.nan),
            "factor": stats.get("factor", 1.0),
            "overruns": int(stats.get("overruns", 0)),
            "nonfinite": self.nonfinite,
            "lost": self.lost,
        }
