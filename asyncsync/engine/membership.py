"""Membership: who is in the run, what the server knows of each worker, and rejoins.

The live set is the store's; this module keeps per-worker records (state, losses, last
sign of life, reported totals) and the version each worker last (re)joined at, which is
where the one rule "a push from before this worker rejoined is refused" is enforced.

Sessions: each join answers a fresh secret, and every later request of that rank must
carry it, so a token holder cannot act as another rank within its session (withdraw its
push, make it leave). One rank has one session. A join for a rank whose session is live
is refused (409) when it carries another secret; one carrying that session's secret is the
same worker re-syncing; one carrying no secret (a fresh process: a restarted copy of the
worker, or a second process given the same rank) takes the rank over. Once the run has
started, the old session ends as if it had timed out (`worker_lost`, with ``replaced``;
the rule sees its leave, then the new session's join). Either way its secret is refused
from then on with a 403 that says so (`takes_over`).

**(choice)** Before the start, too, a join takes over a join of its rank still held at
the start barrier: the held join is answered at once with that 403, and only the
newer one is answered with a secret when the run starts, so a client that re-sends its
join (it timed out, or its proxy did) never holds two sessions, and a worker whose machine
vanished without closing its connection (power loss, a network cut: no FIN reaches the
server) does not keep its rank from its replacement, and the run from starting. The rule
sees neither (it sees first joins at the start), the rank counts once for the barrier,
and the run log has one ``join`` per rank. The price: a worker-token holder can take a
waiting worker's rank as it can a running one's, visibly (the warning below, the 403).
A join held at the barrier whose connection closes is still withdrawn (the transport
cancels it, and the core frees the rank).

Pushes and queries are numbered: each may carry ``seq``, an int the sender raises with
every request of that op in a session (asyncsync's transports number each op's requests
from 1; `NUMBERED_OPS`). The server takes each number of an op once (`WorkerRecord.take`),
so a push or query frame sent again (a replay, or a duplicate delivery) is refused with a
409 whatever the protocol, before its rule sees it (a query may move a rule's state:
ESync's oracle takes the step time it reports). Requests of a session sent at once may
arrive out of order: a number below the highest taken is accepted while it is within
`SEQ_WINDOW` of it and not yet taken. Once a session has sent a numbered request of an
op, an unnumbered one of that op is refused (400); an op a session never numbered (a
hand-built frame) is not checked. Leaves need no number: every join gives a new secret,
so a leave sent again is refused (403) or finds the rank already out (410).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import secrets
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from asyncsync.protocols.base import BadRequest, Forbidden, OutOfStep, brief
from asyncsync.runlog.metrics import STAT_FIELDS
from asyncsync.wire.frames import NUMBERED_OPS

LOG = logging.getLogger("asyncsync.server.sessions")
"""Takeovers are logged here (the HTTP server rate-limits its lines: a token holder could
join in a loop)."""
SERVER_LOG = logging.getLogger("asyncsync.server")
"""Where a worker that keeps sending NaN/Inf is named (not held back with the takeovers)."""
MAX_STAT = 2.0**53
"""The largest reported total kept (beyond it a float no longer counts in ones, and the
status's integer fields would not fit msgpack's 64 bits): larger ones are dropped."""
SEQ_WINDOW = 64
"""How far below the highest number taken a request may still arrive (requests a worker
sends concurrently, at most a few, may overtake each other); an older one is refused."""
MAX_SEQ = 2**63 - 1
"""The largest request number (msgpack's signed 64-bit int)."""
NONFINITE_WARN_AT = frozenset({3, 10, 100, 1000})
"""Counts of refused non-finite pushes at which the server warns about a worker."""
TAKEN_OVER_KEPT = 8
"""How many taken-over secrets of a rank are remembered, so that their holders are told
why they are refused (and cannot take the rank back by rejoining)."""


@dataclass
class SeqWindow:
    """The numbers of one op taken in a session: the highest, and which of the
    `SEQ_WINDOW` below it (bit i: number ``top - i``)."""

    top: int = 0
    taken: int = 0

    def check(self, worker: int, op: str, seq: object) -> None:
        """Refuse `seq` (None: unnumbered) when taken, too old or malformed (see the
        module)."""
        if seq is None:
            if self.top:
                raise BadRequest(f"worker {worker}: a {op} without 'seq' in a session whose "
                                 f"{op}s are numbered")
            return
        if not isinstance(seq, int) or isinstance(seq, bool) or not 1 <= seq <= MAX_SEQ:
            raise BadRequest(f"field 'seq' must be an int from 1 to {MAX_SEQ}, got "
                             f"{brief(seq)}")
        behind = self.top - seq
        if behind >= SEQ_WINDOW or (behind >= 0 and self.taken >> behind & 1):
            raise OutOfStep(f"worker {worker}: {op} {seq} was already received, or is more "
                            f"than {SEQ_WINDOW} behind {op} {self.top}: a {op} is "
                            "applied once (a replayed frame is refused)")

    def take(self, seq: int) -> None:
        """Count `seq` (checked) as taken."""
        ahead = seq - self.top
        if ahead > 0:
            self.taken = (self.taken << ahead | 1 if ahead < SEQ_WINDOW
                          else 1) & ((1 << SEQ_WINDOW) - 1)
            self.top = seq
        else:
            self.taken |= 1 << -ahead


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
    _numbers: dict[str, SeqWindow] = field(default_factory=dict)  # by op, this session's
    _taken_over: deque[str] = field(default_factory=lambda: deque(maxlen=TAKEN_OVER_KEPT))
    _held: asyncio.Task[Any] | None = None  # the task of the join held at the barrier
    _reported: dict[str, Any] | None = None  # the last totals taken, not yet filtered
    _stats: dict[str, float] = field(default_factory=dict)

    def holds(self, secret: object) -> bool:
        """Whether `secret` is this worker's current session secret."""
        return bool(self.session) and _same(secret, self.session)

    def check_session(self, worker: int, secret: object) -> None:
        """Refuse a request that does not carry this worker's session secret."""
        if self.holds(secret):
            return
        self._refuse_taken_over(worker, secret)
        raise Forbidden(f"worker {worker}: missing or wrong session secret (every "
                        "request after a join carries the secret its reply gave)")

    def _refuse_taken_over(self, worker: int, secret: object) -> None:
        """Refuse, saying why, a request carrying a secret whose session was taken over."""
        if any(_same(secret, old) for old in self._taken_over):
            raise Forbidden(f"worker {worker}: this session was taken over by a newer join "
                            f"of rank {worker} (a restarted copy of this worker, or another "
                            f"worker started with rank {worker}); this one is out of the run")

    def takes_over(self, worker: int, secret: object, live: bool, started: bool) -> bool:
        """Whether a join carrying `secret` takes over `worker`'s session in the run (the
        core then ends it: the rule sees it leave); refuses one that may not (see the
        module). A join held at the start barrier is taken over here: it is answered 403
        at once, and False returned (the rule has not seen it)."""
        if secret is not None and not isinstance(secret, str):
            raise BadRequest(f"field 'session' must be a str, got {brief(secret)}")
        held = not started and bool(self.session)  # (its secret was never answered)
        if not (live or held) or (started and self.holds(secret)):
            return False
        self._refuse_taken_over(worker, secret)
        if secret and not self.holds(secret):
            raise OutOfStep(f"worker {worker} has a live session, whose secret this join "
                            "does not carry: a join carries it (a worker re-syncing) or none "
                            "(a restarted worker, which takes the rank over)")
        self._taken_over.append(self.session)
        LOG.warning("worker %d: a join without its session's secret takes the rank over (a "
                    "restarted worker, a re-sent join, or a second one started with rank "
                    "%d); the old session is refused from now on", worker, worker)
        if held and self._held is not None:
            self._held.cancel()  # its wait ends with the 403 (`wait_start`)
        return not held

    async def wait_start(self, worker: int, session: str, started: asyncio.Event) -> None:
        """Hold the join that opened `session` until the run starts (`started`); raise the
        403 of `check_session` at once if a newer join takes the rank over meanwhile.

        The join awaits `started` itself, so the joins resume at the start in the order
        they came, with no hop between (a virtual run's same-instant events keep their
        order); a takeover cancels that wait, told from its connection's close (which the
        core answers by withdrawing the join) by the session having changed.
        """
        task = asyncio.current_task()
        if not started.is_set() and self.session == session:
            self._held = task
            try:
                await started.wait()
            except asyncio.CancelledError:
                if self.session == session or task is None:
                    raise
                task.uncancel()
            finally:
                if self._held is task:  # (not a newer join's, held since)
                    self._held = None
        if self.session != session:
            self._refuse_taken_over(worker, session)
            raise Forbidden(f"worker {worker}: this join was taken over by a newer join of "
                            f"rank {worker}; this one is out of the run")

    def open_session(self) -> str:
        """A fresh secret for a join that `takes_over` has let through."""
        self.session = secrets.token_hex(16)
        self._numbers = {}
        return self.session

    def check_seq(self, worker: int, op: str, seq: object) -> None:
        """Refuse a numbered op's request whose number `seq` (None: unnumbered) this
        session has taken, that is older than `SEQ_WINDOW`, or that is malformed."""
        if op in NUMBERED_OPS:
            self._numbers.get(op, SeqWindow()).check(worker, op, seq)

    def take(self, worker: int, op: str, seq: object, secret: object) -> None:
        """`check_session` again (the request may have waited since `identify`: its session
        taken over or re-synced meanwhile), `check_seq`, then count `seq` as taken. Call
        with no await before the rule sees the request, so that two copies cannot pass."""
        self.check_session(worker, secret)
        self.check_seq(worker, op, seq)
        if op in NUMBERED_OPS and isinstance(seq, int):
            self._numbers.setdefault(op, SeqWindow()).take(seq)

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

    def count_nonfinite(self, worker: int) -> int:
        """Count a refused NaN/Inf push (returns the count); warn when a worker keeps
        sending them."""
        self.nonfinite += 1
        if self.nonfinite in NONFINITE_WARN_AT:
            SERVER_LOG.warning("worker %d has sent %d non-finite updates (all refused); "
                               "its training has probably diverged", worker, self.nonfinite)
        return self.nonfinite

    @staticmethod
    def check_away(worker: int, away: object, started: bool) -> bool:
        """A join's ``away`` field (default false): true on a first join, at the run's
        start, from a worker offline then (its availability trace), which counts for the
        start barrier and downloads the model but is not in the run until it rejoins (no
        round, round 0 included, is drawn from it or waits for it)."""
        if not isinstance(away, bool):
            raise BadRequest(f"field 'away' must be a bool, got {brief(away)}")
        if away and started:
            raise BadRequest(f"worker {worker}: field 'away' is for a first join, before the "
                             "run starts; a worker rejoins when it is online")
        return away

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


def _same(secret: object, expected: str) -> bool:
    """Whether `secret` is the string `expected` (compared in constant time)."""
    return isinstance(secret, str) and hmac.compare_digest(secret.encode(), expected.encode())
