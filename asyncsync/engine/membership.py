"""Membership: who is in the run, what the server knows of each worker, and rejoins.

The live set is the store's; this module keeps per-worker records (state, losses, last
sign of life, reported totals) and the version each worker last (re)joined at, which is
where the one rule "a push from before this worker rejoined is refused" is enforced.

Sessions: each join answers a fresh secret, and every later request of that rank must
carry it, so a token holder cannot act as another rank (withdraw its push, make it leave).
A join for a rank whose session is live is refused unless it carries that session's
secret (the same worker re-syncing); a new session may take the rank once the old one has
left or been dropped after its timeout, or, during the start barrier, once the connection
that carried its join has closed (the transport cancels the join, and the core withdraws it).

Pushes are numbered: each push of a session may carry ``seq``, an int the sender raises
with every push (asyncsync's transports number every push from 1). The server takes each
number once (`WorkerRecord.take_push`), so a push frame sent again (a replay, or a
duplicate delivery) is refused with a 409 whatever the protocol, before its rule sees it.
Pushes of a session sent at once may arrive out of order: a number below the highest
taken is accepted while it is within `PUSH_WINDOW` of it and not yet taken. Once a session
has sent a numbered push, an unnumbered one is refused (400). A push without a number in
a session that never numbered one (a hand-built frame) is not checked.
"""

from __future__ import annotations

import hmac
import math
import secrets
from dataclasses import dataclass, field
from typing import Any

from asyncsync.protocols.base import BadRequest, Forbidden, OutOfStep, brief
from asyncsync.runlog.metrics import STAT_FIELDS

MAX_STAT = 2.0**53
"""The largest reported total kept (beyond it a float no longer counts in ones, and the
status's integer fields would not fit msgpack's 64 bits): larger ones are dropped."""
PUSH_WINDOW = 64
"""How far below the highest push number taken a push may still arrive (pushes a worker
sends concurrently, at most a few, may overtake each other); an older one is refused."""
MAX_SEQ = 2**63 - 1
"""The largest push number (msgpack's signed 64-bit int)."""


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
    _top_push: int = 0  # the highest push number taken in this session (0: none)
    _taken_pushes: int = 0  # bit i: push number `_top_push - i` was taken
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
        self._top_push = self._taken_pushes = 0
        return self.session

    def check_push(self, worker: int, seq: object) -> None:
        """Refuse a push whose number `seq` (None: unnumbered) this session has taken,
        that is older than `PUSH_WINDOW`, or that is malformed (see the module)."""
        if seq is None:
            if self._top_push:
                raise BadRequest(f"worker {worker}: a push without 'seq' in a session whose "
                                 "pushes are numbered")
            return
        if not isinstance(seq, int) or isinstance(seq, bool) or not 1 <= seq <= MAX_SEQ:
            raise BadRequest(f"field 'seq' must be an int from 1 to {MAX_SEQ}, got "
                             f"{brief(seq)}")
        behind = self._top_push - seq
        if behind >= PUSH_WINDOW or (behind >= 0 and self._taken_pushes >> behind & 1):
            raise OutOfStep(f"worker {worker}: push {seq} was already received, or is more "
                            f"than {PUSH_WINDOW} behind push {self._top_push}: a push is "
                            "applied once (a replayed frame is refused)")

    def take_push(self, worker: int, seq: object) -> None:
        """`check_push`, then count `seq` as taken (call with no await before the rule's
        `on_push`, so that two copies of a push cannot both pass)."""
        self.check_push(worker, seq)
        if not isinstance(seq, int):
            return
        ahead = seq - self._top_push
        if ahead > 0:
            self._taken_pushes = (self._taken_pushes << ahead | 1 if ahead < PUSH_WINDOW
                                  else 1) & ((1 << PUSH_WINDOW) - 1)
            self._top_push = seq
        else:
            self._taken_pushes |= 1 << -ahead

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
