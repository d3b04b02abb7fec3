"""The one clock of everything below the supervisor: the running event loop's time.

In real mode the loop's time is the monotonic clock; a virtual-time loop makes it virtual,
and every timestamp, deadline and sleep of the engine, the protocols, the compute
profiles and the link emulation follows. Only this module (and the supervisor: runner,
dashboard, report, CLI) may read the wall clock.

`VirtualTimeLoop` is that virtual-time loop: asyncio's own selector loop with a selector
that jumps time to the next timer instead of sleeping (chosen over `looptime`, which
sleeps in real time while an executor future is pending and waits ~42 idle cycles
before each jump; see the README's "Virtual time").
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Callable
from typing import Any


def now() -> float:
    """Seconds on the running loop's clock; the monotonic clock outside a loop (set-up)."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


def wall() -> float:
    """Real seconds (a performance counter), whatever clock the loop runs on: for what a
    virtual-time run costs the host and for calibrating its steps, never for run time."""
    return time.perf_counter()


class Stopwatch:
    """Seconds since `start()` (or creation) on the one clock."""

    def __init__(self) -> None:
        self._t0 = now()

    def start(self, elapsed: float = 0.0) -> None:
        """Restart, as if `elapsed` seconds had already passed."""
        self._t0 = now() - elapsed

    def elapsed(self) -> float:
        return now() - self._t0


class VirtualTimeError(RuntimeError):
    """Something would leak real time into a virtual-time run, or the run is stuck."""


class _JumpingSelector(selectors.DefaultSelector):
    """A selector that, instead of sleeping until the loop's next timer, moves the loop's
    virtual time there (real readiness, e.g. the loop's self-pipe, is polled first)."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[Any, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        assert self.loop is not None
        if timeout is None:
            raise VirtualTimeError(
                "virtual time is stuck: no callback is ready and no timer is pending "
                f"(waiting: {self.loop.describe_waiters()})")
        self.loop.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose `time()` is virtual: when nothing is ready, time jumps to the
    next timer, so sleeping, waiting and (emulated) transfers cost no real time.

    Threads would leak real time (the loop would jump past work a thread is still doing),
    so `run_in_executor` raises; so does any socket the loop would watch.
    """

    def __init__(self) -> None:
        selector = _JumpingSelector()
        super().__init__(selector)
        selector.loop = self
        self._now = 0.0
        self._watcher: tuple[float, Callable[[], None]] | None = None
        self._next_watch = 0.0

    def time(self) -> float:
        return self._now

    def watch(self, period_s: float, callback: Callable[[], None]) -> None:
        """Call `callback` whenever virtual time has moved `period_s` past its last call.

        It is called from the loop's own time jumps and schedules nothing, so a watched
        run's timers, and hence the order of its equal-time events and its logs, are those
        of an unwatched run (a watcher task sleeping on the loop would add timers, and
        asyncio breaks ties between equal timers by the heap's shape).
        """
        self._watcher = (period_s, callback)
        self._next_watch = self._now + period_s

    def advance(self, seconds: float) -> None:
        """Move virtual time forward (the selector does this when the loop would sleep)."""
        self._now += max(0.0, seconds)
        if self._watcher is not None and self._now >= self._next_watch:
            period_s, callback = self._watcher
            self._next_watch = self._now + period_s
            callback()

    def run_in_executor(self, executor: Any, func: Any, *args: Any) -> Any:  # type: ignore[override]
        raise VirtualTimeError(f"a thread ({getattr(func, '__name__', func)!r}) would run in "
                               "real time during a virtual-time run; compute inline instead")

    def describe_waiters(self) -> str:
        """The pending tasks and what each awaits (for a stuck run's error)."""
        lines = []
        for task in asyncio.all_tasks(self):
            frame = task.get_stack(limit=1)
            where = (f"{frame[-1].f_code.co_name}:{frame[-1].f_lineno}" if frame else "?")
            lines.append(f"{task.get_name()} at {where}")
        return "; ".join(sorted(lines)) or "no task"

    def _ensure_fd_no_transport(self, fd: Any) -> None:  # a socket in virtual time
        raise VirtualTimeError("sockets cannot be used in a virtual-time run (kernel timing "
                               "would leak in); use the in-process transport")
