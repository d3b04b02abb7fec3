"""The virtual loop's timer heap and `clock.sleep`: every timer runs at its exact instant,
ties in the order set, and `clock.sleep` wakes as `asyncio.sleep` does.

A virtual run's results depend on the order of equal-time events. The loop keeps integer
nanosecond ticks in a heap of ``(tick, order set, timer)`` (C comparisons); a random program
of many tied, chained and cancelled timers checks it against closed forms: each timer runs
at the instant it was set for (its setter's time plus its delay, in exact decimals), in
order of time and, at one instant, of setting; a cancelled timer never runs.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from fractions import Fraction
from typing import Any

import pytest

from asyncsync.clock import VirtualTimeLoop, sleep


def timer_program(loop: VirtualTimeLoop, seed: int
                  ) -> tuple[list[tuple[float, int]], dict[int, Fraction], set[int]]:
    """Timers at few distinct times (many ties), some cancelled, callbacks that set more
    timers; returns what ran (loop time, tag) in order, each tag's exact due time, and the
    tags cancelled before they ran. Tags grow in the order the timers are set."""
    rng = random.Random(seed)
    ran: list[tuple[float, int]] = []
    due: dict[int, Fraction] = {}
    handles: dict[int, asyncio.TimerHandle] = {}
    cancelled: set[int] = set()
    count = [0]

    def fire(tag: int) -> None:
        ran.append((loop.time(), tag))
        if count[0] < 3000:
            for _ in range(rng.randint(0, 3)):
                count[0] += 1
                delay = rng.choice(["0", "0.1", "0.1", "0.2", "0.25", "0.5"])
                due[count[0]] = due[tag] + Fraction(delay)
                handles[count[0]] = loop.call_later(float(delay), fire, count[0])
            if handles and rng.random() < 0.4:  # enough to trigger the heap's rebuild
                victim = rng.choice(sorted(handles))
                if all(victim != t for _, t in ran):
                    cancelled.add(victim)
                handles[victim].cancel()

    async def main() -> None:
        for _ in range(200):
            count[0] += 1
            at = rng.choice(["0.1", "0.2", "0.3"])
            due[count[0]] = Fraction(at)
            handles[count[0]] = loop.call_at(float(at), fire, count[0])
        while loop.time() < 60 and count[0] < 3000:
            await asyncio.sleep(1.0)

    loop.run_until_complete(main())
    return ran, due, cancelled


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_timers_run_at_their_exact_instant_ties_in_the_order_set(seed: int) -> None:
    loop = VirtualTimeLoop()
    try:
        ran, due, cancelled = timer_program(loop, seed)
    finally:
        loop.close()
    assert len(ran) > 1000 and cancelled
    for time, tag in ran:
        assert time == float(due[tag]), (tag, time, due[tag])
    keys = [(due[tag], tag) for _, tag in ran]
    assert keys == sorted(keys)  # by time, then by order set
    assert not cancelled & {tag for _, tag in ran}
    assert len({tag for _, tag in ran}) == len(ran)


def sleeper_program(nap: Callable[[float], Awaitable[None]]) -> list[tuple[float, str]]:
    """Tasks sleeping equal and unequal times, one cancelled while asleep."""
    loop = VirtualTimeLoop()
    woke: list[tuple[float, str]] = []

    async def sleeper(name: str, naps: list[float]) -> None:
        for seconds in naps:
            await nap(seconds)
            woke.append((loop.time(), name))

    async def main() -> Any:
        tasks = [asyncio.create_task(sleeper(f"s{i}", [0.1 * (i % 3), 0.2, 0.1 * (i % 2)]))
                 for i in range(12)]
        victim = asyncio.create_task(sleeper("victim", [5.0]))
        await nap(0.15)
        victim.cancel()
        outcome = await asyncio.gather(victim, return_exceptions=True)
        cancelled = loop._timer_cancelled_count  # type: ignore[attr-defined]
        woke.append((loop.time(), f"cancelled timers in the heap: {cancelled}"))
        await asyncio.gather(*tasks)
        return outcome

    try:
        outcome = loop.run_until_complete(main())
    finally:
        loop.close()
    assert isinstance(outcome[0], asyncio.CancelledError)
    return woke


def test_clock_sleep_wakes_in_asyncio_sleeps_order() -> None:
    stock = sleeper_program(asyncio.sleep)
    assert sleeper_program(sleep) == stock
    assert (0.15, "cancelled timers in the heap: 1") in stock  # the victim's timer dropped
    assert [t for t, name in stock if name == "s5"] == [0.2, 0.4, 0.5]  # 0.2 + 0.2 + 0.1


class _CountingLoop(VirtualTimeLoop):
    """A virtual loop that counts its iterations and gives up after `limit` of them, so a
    loop that would spin for ever fails the test instead of hanging it."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.iterations = 0
        self.limit = limit

    def _run_once(self) -> None:
        self.iterations += 1
        if self.iterations > self.limit:
            raise RuntimeError(f"still running after {self.limit} iterations")
        super()._run_once()


@pytest.mark.parametrize("delay", [1e7, 1e8, 3.0e9, 1e15])
def test_a_long_sleep_ends_in_a_few_iterations_at_the_exact_time(delay: float) -> None:
    """Virtual time has no reason to cap a jump at asyncio's one-day select timeout
    (1e15 s took 1.2e10 iterations), and past 2**24 s a timer due at the loop's time must
    still fire although ``time + 1e-9`` rounds back to that time (it spun for ever)."""
    loop = _CountingLoop(limit=50)

    async def sleep_then_step() -> tuple[float, float]:
        await sleep(delay)
        woke = loop.time()
        await sleep(delay / 2)
        return woke, loop.time()

    try:
        woke, then = loop.run_until_complete(sleep_then_step())
    finally:
        loop.close()
    assert woke == delay
    assert then == delay + delay / 2
