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
    timer = loop.call_at(loop.time() + delay, _wake, future)
    try:
        await future
    except BaseException:  # cancelled while asleep: as asyncio.sleep, drop the timer
        timer.cancel()
        raise


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
        if timeout is None:
            raise VirtualTimeError(
                "virtual time is stuck: no callback is ready and no timer is pending "
                f"(waiting: {self.loop.describe_waiters()})")
        self.loop.advance(timeout)
        return []


_ASYNCIO: Any = base_events  # its private constants, which typeshed does not declare


class _Due(float):
    """A timer's deadline as the virtual loop's heap holds it, with the timer beside it.

    asyncio's heap holds the `TimerHandle`s themselves, whose ``__lt__`` is Python code,
    run about ``2 log2(timers)`` times a pop (4.4 million calls in 6 virtual seconds of
    10,000 bsp workers). A float compares in C, and two equal deadlines compare equal exactly as the
    handles do, so the same pushes and pops give the heap the same shape and release
    equal-time timers in the same order as asyncio's own heap: the runs are unchanged.
    """

    __slots__ = ("timer",)
    timer: Any  # an events.TimerHandle, whose private fields the loop reads


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose `time()` is virtual: when nothing is ready, time jumps to the
    next timer, so sleeping, waiting and (emulated) transfers cost no real time.

    Threads would leak real time (the loop would jump past work a thread is still doing),
    so `run_in_executor` raises; so does any socket the loop would watch.

    Its timers live in a heap of `_Due` deadlines (`call_at`, `_run_once`): asyncio's
    steps, in asyncio's order, with C comparisons. `_run_once` is asyncio's (3.11-3.13)
    with that heap, less debug mode's warnings about slow callbacks.
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

    def unwatch(self) -> None:
        """Stop calling the `watch` callback."""
        self._watcher = None

    def advance(self, seconds: float) -> None:
        """Move virtual time forward (the selector does this when the loop would sleep)."""
        self._now += max(0.0, seconds)
        if self._watcher is not None and self._now >= self._next_watch:
            period_s, callback = self._watcher
            self._next_watch = self._now + period_s
            callback()

    def call_at(self, when: float, callback: Callable[..., object], *args: Any,  # type: ignore[override]
                context: Any = None) -> events.TimerHandle:
        loop: Any = self  # asyncio's private state, which typeshed does not declare
        loop._check_closed()
        if loop._debug:
            loop._check_thread()
            loop._check_callback(callback, "call_at")
        timer: Any = events.TimerHandle(when, callback, args, self, context)
        if timer._source_traceback:
            del timer._source_traceback[-1]
        due = _Due(when)
        due.timer = timer
        heapq.heappush(loop._scheduled, due)
        timer._scheduled = True
        return timer  # type: ignore[no-any-return]

    def _run_once(self) -> None:
        """One iteration: drop cancelled timers, poll (the jumping selector moves time to
        the next timer when nothing is ready), move due timers to the ready queue, run
        what was ready. Step for step asyncio's `BaseEventLoop._run_once`, but for two
        things that only matter at large virtual times: a jump is not capped at asyncio's
        one-day select timeout (a 1e15 s step took 1.2e10 iterations), and a timer due
        at the loop's time is due even past 2**24 s, where ``time + 1e-9`` rounds back to
        that time (the loop spun there for ever)."""
        loop: Any = self
        scheduled: list[Any] = loop._scheduled
        count = len(scheduled)
        if (count > _ASYNCIO._MIN_SCHEDULED_TIMER_HANDLES and loop._timer_cancelled_count
                / count > _ASYNCIO._MIN_CANCELLED_TIMER_HANDLES_FRACTION):
            kept = []
            for due in scheduled:
                if due.timer._cancelled:
                    due.timer._scheduled = False
                else:
                    kept.append(due)
            heapq.heapify(kept)
            loop._scheduled = scheduled = kept
            loop._timer_cancelled_count = 0
        else:
            while scheduled and scheduled[0].timer._cancelled:
                loop._timer_cancelled_count -= 1
                heapq.heappop(scheduled).timer._scheduled = False
        timeout = None
        if loop._ready or loop._stopping:
            timeout = 0
        elif scheduled:
            timeout = max(0, scheduled[0] - self._now)
        loop._process_events(loop._selector.select(timeout))
        end_time = max(self._now + loop._clock_resolution, math.nextafter(self._now, math.inf))
        ready = loop._ready
        while scheduled and scheduled[0] < end_time:
            timer = heapq.heappop(scheduled).timer
            timer._scheduled = False
            ready.append(timer)
        for _ in range(len(ready)):
            handle = ready.popleft()
            if not handle._cancelled:
                handle._run()

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
