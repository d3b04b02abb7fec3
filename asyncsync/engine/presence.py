"""A worker's presence: when its availability trace takes it offline and brings it back.

While offline a worker computes and sends nothing (its protocol loop and heartbeats are
cancelled), and the server treats it as a worker that left: it sends ``leave`` as it goes.
When it is next online it rejoins through the worker's own rejoin path. Times are seconds
since the run's start on the run's clock (virtual or real).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable
from typing import NoReturn

from asyncsync.clock import sleep
from asyncsync.errors import LoopWentOn
from asyncsync.hetero.availability import OnlineTimes
from asyncsync.protocols.base import NotInRun, OutOfStep, RunStopped
from asyncsync.runlog.metrics import WorkerMetrics
from asyncsync.runlog.schema import Kind, record

SLACK_S = 1e-6
"""A wake-up this close to an interval's edge counts as past it (clock arithmetic rounds)."""

STOP_GRACE = 64
"""How many times a worker is told `RunStopped`, the first included, before its next
request or computation ends it with `LoopWentOn`: room for the exchanges its loop started
in the background before the loop saw the stop (Streaming DiLoCo: two requests a
fragment)."""


class StopLatch:
    """The end of a worker's run, once seen, for its later requests and computations.

    After the first `RunStopped` (the server's ``stop``, or the step budget), a request
    (but ``leave``) raises `RunStopped` again without reaching the server, as a computation
    past the budget does, so that a background exchange that started late ends as the loop
    does. A loop whose own ``except Exception`` swallows the stop and asks on ends with
    `LoopWentOn` once told `STOP_GRACE` times, instead of training on for ever.
    """

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.after = 0  # RunStopped raised so far (0: the run goes on for this worker)

    def stop(self, what: str) -> NoReturn:
        """Raise `RunStopped` at a `what` (an operation, a computation) and count it;
        `LoopWentOn` once past the grace."""
        self.after += 1
        if self.after > STOP_GRACE:
            raise LoopWentOn(f"worker {self.rank}: its loop asked for a {what} after being "
                             f"told RunStopped {STOP_GRACE} times (an `except Exception` "
                             "swallows it; let RunStopped through)")
        raise RunStopped

    def check(self, what: str) -> None:
        """`stop` at `what` if the run has stopped, unless `what` is a leave."""
        if self.after and what != "leave":
            self.stop(what)


class WentOffline(Exception):
    """The worker's availability trace took it offline."""


class Presence:
    """Times a worker's sessions by its online intervals (None: online throughout)."""

    def __init__(self, times: OnlineTimes | None, metrics: WorkerMetrics) -> None:
        self.times = times
        self.metrics = metrics
        self._away = times is not None and not times.online_at(SLACK_S)  # at the start

    def join_fields(self) -> dict[str, bool]:
        """Fields of the worker's join: ``away`` on its first, when it is offline at the
        run's start (the server leaves it out of the run, round 0 included)."""
        return {"away": True} if self._away else {}

    async def session(self, run: Callable[[], Awaitable[None]]) -> None:
        """Run a session (`run`); but raise `WentOffline` at once, without one, the first
        time when the worker is offline at the run's start (it joined away)."""
        if self._away:
            self._away = False
            raise WentOffline
        await run()

    def watch(self) -> list[asyncio.Task[None]]:
        """A task that ends when the trace takes the worker offline (none without a
        trace, or while it never goes offline)."""
        if self.times is None:
            return []
        t = self.metrics.now() + SLACK_S
        end = self.times.offline_at(t)
        return [] if end == math.inf else [asyncio.create_task(sleep(end - t + SLACK_S))]

    async def absence(self, leave: Callable[[], Awaitable[object]]) -> None:
        """Leave (`leave` sends it), then wait, sending nothing, until the worker is online
        again. An interval that ended while the worker left or slept (a leave can outlast
        a short one) is skipped: it waits for the next. Raises `RunStopped` when the run
        stopped meanwhile or the worker is never online again."""
        assert self.times is not None
        went = self.metrics.now() + SLACK_S
        with contextlib.suppress(OutOfStep, NotInRun, OSError):  # already out: as good
            await leave()
        back = self._next_online()
        self.metrics.log.write(record(Kind.OFFLINE, t=round(went, 4), until=back))
        while back is not None:
            await sleep(back - self.metrics.now())
            if self.times.online_at(self.metrics.now() + SLACK_S):
                self.metrics.log.write(record(Kind.ONLINE, t=round(self.metrics.now(), 4)))
                return
            back = self._next_online()
        raise RunStopped

    def _next_online(self) -> float | None:
        """When the worker is next online, from now (None: never)."""
        assert self.times is not None
        t = self.metrics.now() + SLACK_S
        back = self.times.online_from(t)
        return None if back is None else max(back, t)
