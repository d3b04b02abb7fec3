"""The one clock of everything below the supervisor: the running event loop's time.

In real mode the loop's time is the monotonic clock; a virtual-time loop makes it virtual,
and every timestamp, deadline and sleep of the engine, the protocols, the compute
profiles and the link emulation follows. Only this module (and the supervisor: runner,
dashboard, report, CLI) may read the wall clock.

`VirtualTimeLoop` is that virtual-time loop: asyncio's own selector loop with a selector
that jumps time to the next timer instead of sleeping (chosen over `looptime`, which
sleeps in real time while an executor future is pending and waits ~42 idle cycles
before each jump; see docs/virtual-time.md).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import selectors
import time
from asyncio import base_events, events
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


async def sleep(delay: float) -> None:
    """`asyncio.sleep(delay)` (same timer, same wake-up, same order), less its cancelling
    of a timer that has already fired, which changes nothing and cost a simulated
    exchange about 1.5 us a sleep."""
    if delay <= 0:
        await asyncio.sleep(0)
        return
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    timer = loop.call_later(delay, _wake, future)
    try:
        await future
    except BaseException:  # cancelled while asleep: as asyncio.sleep, drop the timer
        timer.cancel()
        raise


def _infinite_ticks(delay: float, callback: object) -> float:
    """The tick of a timer `delay` seconds away that is not finite: never (+inf), now (-inf);
    NaN is refused."""
    if math.isnan(delay):
        raise ValueError(f"a timer for {callback!r} at NaN seconds")
    return delay


def _wake(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.set_result(None)


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
        self.loop.jump()
        return []


_ASYNCIO: Any = base_events  # its private constants, which typeshed does not declare
TICKS_PER_S = 10**9
"""Virtual time is kept in integer ticks of a nanosecond: a timer is due at a tick, sums of
steps are exact (ten steps of 0.1 s end at the tick of 1 s, as a 1 s timer does), and
`time()` is the tick over this, rounded once."""
_TICKS_PER_S_FLOAT = float(TICKS_PER_S)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose `time()` is virtual: when nothing is ready, time jumps to the
    next timer, so sleeping, waiting and (emulated) transfers cost no real time.

    **(choice) Time and ties.** Time is an integer count of nanoseconds (`TICKS_PER_S`):
    a timer's delay is rounded to the nearest tick and added to the tick it was set at,
    so no rounding accumulates. Timers due at the same tick run in the order they were
    set (first in, first out), then the callbacks they make ready, each iteration as
    asyncio's (a timer is due only at or after its tick: none runs early).

    Threads would leak real time (the loop would jump past work a thread is still doing),
    so `run_in_executor` raises; so does any socket the loop would watch. An exception in a
    plain callback (a timer, a done callback) ends the run with that exception instead of
    being logged (asyncio's default), and so does, at the next iteration, a task's
    exception that nobody retrieved; with an exception handler of its own, the loop calls
    it as asyncio does.

    `_run_once` is asyncio's (3.11-3.13) with this heap of ``(tick, order, timer)``
    entries (C comparisons), less debug mode's warnings about slow callbacks.
    """

    def __init__(self) -> None:
        selector = _JumpingSelector()
        super().__init__(selector)
        selector.loop = self
        self._ticks = 0
        self._now = 0.0
        self._order = itertools.count()
        self._failure: BaseException | None = None
        self._watcher: tuple[float, float | None, Callable[[], None]] | None = None
        self._next_watch = 0.0
        self._next_real = math.inf

    def time(self) -> float:
        return self._now

    def watch(self, period_s: float, callback: Callable[[], None],
              real_period_s: float | None = None) -> None:
        """Call `callback` whenever virtual time has moved `period_s` past its last call,
        or, with `real_period_s`, that many real seconds have passed since it (checked at
        each time jump: a slow run's status stays fresh and a stop it raises is prompt).

        It is called from the loop's own time jumps and schedules nothing, so a watched
        run's timers, and hence the order of its equal-time events and its logs, are those
        of an unwatched run.
        """
        self._watcher = (period_s, real_period_s, callback)
        self._next_watch = self._now + period_s
        self._next_real = wall() + real_period_s if real_period_s is not None else math.inf

    def unwatch(self) -> None:
        """Stop calling the `watch` callback."""
        self._watcher = None

    def jump(self) -> None:
        """Move virtual time to the next timer's tick (the selector does this when the loop
        would sleep); with none that can ever be due, the run is stuck.

        Raises:
            VirtualTimeError: nothing is ready and no timer is pending at a finite time.
        """
        scheduled: list[Any] = self._scheduled  # type: ignore[attr-defined]
        if not scheduled or scheduled[0][0] == math.inf:
            raise VirtualTimeError(
                "virtual time is stuck: no callback is ready and no timer is pending "
                f"(waiting: {self.describe_waiters()})")
        tick = scheduled[0][0]
        if tick > self._ticks:
            self._ticks = tick
            self._now = tick / TICKS_PER_S
        if self._watcher is not None:
            period_s, real_period_s, callback = self._watcher
            if self._now >= self._next_watch or (
                    real_period_s is not None and wall() >= self._next_real):
                self._next_watch = self._now + period_s
                if real_period_s is not None:
                    self._next_real = wall() + real_period_s
                callback()

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any,  # type: ignore[override]
                   context: Any = None) -> events.TimerHandle:
        try:
            tick: float = self._ticks + round(delay * _TICKS_PER_S_FLOAT)
        except (ValueError, OverflowError):  # NaN or infinite
            tick = _infinite_ticks(delay, callback)
        return self._set(tick, callback, args, context)

    def call_at(self, when: float, callback: Callable[..., object], *args: Any,  # type: ignore[override]
                context: Any = None) -> events.TimerHandle:
        return self.call_later(when - self._now, callback, *args, context=context)

    def _set(self, tick: float, callback: Callable[..., object], args: tuple[Any, ...],
             context: Any) -> events.TimerHandle:
        """A timer due at `tick` (an int; infinite: never), after those set before it."""
        loop: Any = self  # asyncio's private state, which typeshed does not declare
        loop._check_closed()
        if loop._debug:
            loop._check_thread()
            loop._check_callback(callback, "call_at")
        timer: Any = events.TimerHandle(tick / _TICKS_PER_S_FLOAT, callback, args, self, context)
        if timer._source_traceback:
            del timer._source_traceback[-1]
        heapq.heappush(loop._scheduled, (tick, next(self._order), timer))
        timer._scheduled = True
        return timer  # type: ignore[no-any-return]

    def _run_once(self) -> None:
        """One iteration: drop cancelled timers, poll (the jumping selector moves time to
        the next timer when nothing is ready), move due timers to the ready queue, run
        what was ready. Step for step asyncio's `BaseEventLoop._run_once`, but a jump is
        not capped at asyncio's one-day select timeout (a 1e15 s step took 1.2e10
        iterations) and a timer is due at its tick, not within a clock resolution."""
        loop: Any = self
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        scheduled: list[Any] = loop._scheduled
        count = len(scheduled)
        if (count > _ASYNCIO._MIN_SCHEDULED_TIMER_HANDLES and loop._timer_cancelled_count
                / count > _ASYNCIO._MIN_CANCELLED_TIMER_HANDLES_FRACTION):
            kept = []
            for entry in scheduled:
                if entry[2]._cancelled:
                    entry[2]._scheduled = False
                else:
                    kept.append(entry)
            heapq.heapify(kept)
            loop._scheduled = scheduled = kept
            loop._timer_cancelled_count = 0
        else:
            while scheduled and scheduled[0][2]._cancelled:
                loop._timer_cancelled_count -= 1
                heapq.heappop(scheduled)[2]._scheduled = False
        timeout = None if not scheduled else 1.0  # any positive: jump to the next timer
        if loop._ready or loop._stopping:
            timeout = 0
        loop._process_events(loop._selector.select(timeout))
        now = self._ticks
        ready = loop._ready
        while scheduled and scheduled[0][0] <= now:
            timer = heapq.heappop(scheduled)[2]
            timer._scheduled = False
            ready.append(timer)
        for _ in range(len(ready)):
            handle = ready.popleft()
            if not handle._cancelled:
                handle._run()

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        """Raise a plain callback's exception out of the loop (it ends the run); keep a
        never-retrieved task's or future's for the next iteration to raise. With a handler
        set, or for a context without an exception, asyncio's behaviour."""
        exception = context.get("exception")
        if self.get_exception_handler() is not None or not isinstance(exception, Exception):
            super().call_exception_handler(context)
        elif "handle" in context:
            raise exception
        elif self._failure is None and not self.is_closed():
            self._failure = exception
        else:
            super().call_exception_handler(context)

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
