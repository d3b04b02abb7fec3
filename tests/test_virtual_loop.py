"""The virtual loop's own timer heap and `clock.sleep` keep asyncio's order exactly.

A virtual run's results depend on the order of equal-time events, which asyncio's heap of
`TimerHandle`s decides by its shape. The virtual loop keeps float deadlines in its heap
instead (C comparisons), and `clock.sleep` skips asyncio.sleep's cancelling of a fired
timer: both must release, wake and run everything in the stock order.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from asyncsync.clock import VirtualTimeLoop, sleep


class StockHeapLoop(VirtualTimeLoop):
    """The virtual loop with asyncio's own `call_at` and `_run_once` (a heap of handles)."""

    call_at = asyncio.SelectorEventLoop.call_at
    _run_once = asyncio.SelectorEventLoop._run_once  # type: ignore[attr-defined]


def timer_program(loop: asyncio.AbstractEventLoop, seed: int) -> list[tuple[float, int]]:
    """Timers at few distinct times (many ties), some cancelled, callbacks that schedule
    more timers and soon-callbacks; returns what ran, in order, with the loop's time."""
    rng = random.Random(seed)
    ran: list[tuple[float, int]] = []
    handles: list[asyncio.TimerHandle] = []
    count = [0]

    def fire(tag: int) -> None:
        ran.append((loop.time(), tag))
        if count[0] < 3000:
            for _ in range(rng.randint(0, 3)):
                count[0] += 1
                delay = rng.choice([0.0, 0.1, 0.1, 0.2, 0.25, 0.5])
                handles.append(loop.call_later(delay, fire, count[0]))
            if rng.random() < 0.3:
                count[0] += 1
                loop.call_soon(fire, count[0])
            if handles and rng.random() < 0.4:  # enough to trigger the heap's rebuild
                handles[rng.randrange(len(handles))].cancel()

    async def main() -> None:
        for tag in range(200):
            handles.append(loop.call_at(rng.choice([0.1, 0.2, 0.3]), fire, -tag))
        while loop.time() < 60 and count[0] < 3000:
            await asyncio.sleep(1.0)

    loop.run_until_complete(main())
    return ran


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_float_heap_runs_timers_in_asyncios_order(seed: int) -> None:
    orders = []
    for make in (StockHeapLoop, VirtualTimeLoop):
        loop = make()
        try:
            orders.append(timer_program(loop, seed))
        finally:
            loop.close()
    stock, ours = orders
    assert len(stock) > 1000
    assert ours == stock


def sleeper_program(nap: Callable[[float], Awaitable[None]]) -> list[tuple[float, str]]:
    """Tasks sleeping equal and unequal times, one cancelled while asleep, in a stock loop."""
    loop = StockHeapLoop()
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
