"""Membership: who is in the run, what the server knows of each worker, and rejoins.

The live set is the store's; this module keeps per-worker records (state, losses, last
sign of life, reported totals) and the version each worker last (re)joined at, which is
where the one rule "a push from before this worker rejoined is refused" is enforced.

Sessions: each join answers a fresh secret, and every later request of that rank must
carry it, so a token holder cannot act as another rank (withdraw its push, make it leave).
A join for a rank whose session is live is refused unless it carries that session's
secret (the same worker re-syncing); a new session may take the rank once the old one has
left or been dropped after its timeout.
"""

from __future__ import annotations

import hmac
import math
import secrets
from dataclasses import dataclass, field
from typing import Any

from asyncsync.protocols.base import Forbidden, OutOfStep
from asyncsync.runlog.metrics import STAT_FIELDS

MAX_STAT = 2.0**53
"""The largest reported total kept (beyond it a float no longer counts in ones, and the
status's integer fields would not fit msgpack's 64 bits): larger ones are dropped."""


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
    session: str = ""
    _reported: dict[str, Any] | None = None  # the last totals taken, not yet filtered
    _stats: dict[str, float] = field(default_factory=dict)

    def holds(self, secret: object) -> bool:
        """Whether `secret` is this worker's current session secret."""
        return (bool(self.session) and isinstance(secret, str)
                and hmac.compare_digest(secret.encode(), self.session.encode()))

    def check_session(self, worker: int, secret: object) -> None:
        """Refuse a request that does not carry this worker's session secret."""
        if not self.holds(secret):
            raise Forbidden(f"worker {worker}: missing or wrong session secret (every "
                            "request after a join carries the secret its reply gave)")

    def open_session(self, worker: int, secret: object, live: bool) -> str:
        """A fresh secret for a join; refused while another session of `worker` is live."""
        if live and not self.holds(secret):
            raise OutOfStep(f"worker {worker} has a live session; another may join once it "
                            "has left or timed out")
        self.session = secrets.token_hex(16)
        return self.session

    def take_stats(self, stats: object) -> None:
        """Keep the worker's reported totals (a map: every request carries one; filtered
        when read, so a request pays no per-field work). The map is the decoded header's
        own, which no one else holds."""
        if isinstance(stats, dict):
            self._reported = stats

    @property
    def stats(self) -> dict[str, float]:
        """The last reported totals: their known numeric fields within +-`MAX_STAT`."""
        if self._reported is not None:
            self._stats = {k: float(v) for k, v in self._reported.items()
                           if k in STAT_FIELDS and isinstance(v, int | float)
                           and not isinstance(v, bool) and -MAX_STAT <= v <= MAX_STAT}
            self._reported = None
        return self._stats

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
