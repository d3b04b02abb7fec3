"""The virtual clock as a discrete-event simulator: exact time, FIFO ties, loud errors.

Expected values are closed forms: n sleeps of d seconds end at n x d, timers due at the
same instant run in the order they were set, a cancelled timer never runs, and an idle
stretch costs loop iterations per event, never per virtual second.
"""

from __future__ import annotations

import asyncio
from fractions import Fraction

import pytest

from asyncsync.clock import VirtualTimeLoop, sleep


def run(loop: VirtualTimeLoop, coroutine: object) -> object:
    try:
        return loop.run_until_complete(coroutine)  # type: ignore[arg-type]
    finally:
        loop.close()


@pytest.mark.parametrize(("steps", "step_s"), [(10, 0.1), (3, 0.1), (40, 0.15),
                                               (100_000, 0.01), (7, 1e-3)])
def test_many_small_sleeps_end_at_the_exact_sum(steps: int, step_s: float) -> None:
    """Before, each sleep added its float to the loop's time: ten sleeps of 0.1 s ended at
    0.9999999999999999, so a step that should tie with a 1 s budget came first."""
    loop = VirtualTimeLoop()

    async def stepper() -> float:
        for _ in range(steps):
            await sleep(step_s)
        return loop.time()

    expected = float(Fraction(steps) * Fraction(str(step_s)))  # the decimal sum, rounded once
    assert run(loop, stepper()) == expected


def test_a_sum_of_steps_ties_with_one_long_timer_and_the_earlier_set_runs_first() -> None:
    """A 1 s budget set at 0 and ten 0.1 s steps end at the same instant: the budget, set
    first, runs first (before, the steps' rounded sum ended earlier and won)."""
    loop = VirtualTimeLoop()
    order: list[tuple[str, float]] = []

    async def budget() -> None:
        await sleep(1.0)
        order.append(("budget", loop.time()))

    async def steps() -> None:
        for _ in range(10):
            await sleep(0.1)
        order.append(("steps", loop.time()))

    async def main() -> None:
        await asyncio.gather(budget(), steps())

    run(loop, main())
    assert order == [("budget", 1.0), ("steps", 1.0)]


def test_timers_due_at_the_same_instant_run_in_the_order_they_were_set() -> None:
    """Equal deadlines are broken by insertion order, not by the heap's shape (heapq is not
    stable: before, 50 timers at 1 s ran 0, 49, 48, ...)."""
    loop = VirtualTimeLoop()
    ran: list[int] = []

    async def main() -> None:
        for tag in range(50):
            loop.call_at(1.0, ran.append, tag)
        await sleep(0.5)
        for tag in range(50, 100):  # set later, to the same instant: after the first 50
            loop.call_later(0.5, ran.append, tag)
        await sleep(1.0)

    run(loop, main())
    assert ran == list(range(100))


def test_a_timer_cancelled_by_an_earlier_callback_at_the_same_instant_never_runs() -> None:
    loop = VirtualTimeLoop()
    ran: list[str] = []

    async def main() -> None:
        cancel: list[asyncio.TimerHandle] = []
        loop.call_at(2.0, lambda: cancel[0].cancel())  # runs first: the target is due too
        cancel.append(loop.call_at(2.0, ran.append, "cancelled"))
        loop.call_at(2.0, ran.append, "kept")
        doomed = [loop.call_at(3.0 + i, ran.append, f"doomed {i}") for i in range(200)]
        for handle in doomed:  # enough cancelled timers for the heap to be rebuilt
            handle.cancel()
        await sleep(300.0)

    run(loop, main())
    assert ran == ["kept"]


def test_an_exception_in_a_callback_ends_the_run_instead_of_being_logged() -> None:
    """asyncio logs an error raised by a plain callback (a timer, a done callback) and goes
    on; in a simulation that leaves waiters never woken and results silently wrong."""
    loop = VirtualTimeLoop()

    def broken() -> None:
        raise ZeroDivisionError("in a timer")

    async def main() -> str:
        loop.call_later(1.0, broken)
        await sleep(5.0)
        return "went on"

    with pytest.raises(ZeroDivisionError, match="in a timer"):
        run(loop, main())


def test_a_nan_deadline_is_refused_with_its_reason() -> None:
    loop = VirtualTimeLoop()
    try:
        with pytest.raises(ValueError, match="NaN"):
            loop.call_at(float("nan"), print)
    finally:
        loop.close()


class _CountingLoop(VirtualTimeLoop):
    def __init__(self) -> None:
        super().__init__()
        self.iterations = 0

    def _run_once(self) -> None:
        self.iterations += 1
        super()._run_once()


def test_idle_virtual_time_costs_iterations_per_event_not_per_second() -> None:
    """1,000 tasks sleep 1e3 s each ten times in lockstep (1e4 virtual s): the loop runs a
    few iterations per distinct instant, however long the gaps."""
    loop = _CountingLoop()

    async def sleeper() -> None:
        for _ in range(10):
            await sleep(1e3)

    async def main() -> float:
        await asyncio.gather(*(sleeper() for _ in range(1000)))
        return loop.time()

    assert run(loop, main()) == 1e4
    assert loop.iterations <= 10 * 3 + 10


def test_a_task_that_failed_unheard_ends_the_run() -> None:
    """A task nobody awaits (fire and forget) that raises: asyncio logs "Task exception was
    never retrieved" when it is collected, and the run went on without what it did."""
    loop = VirtualTimeLoop()

    async def fails() -> None:
        await sleep(1.0)
        raise KeyError("lost")

    async def main() -> str:
        loop.create_task(fails())  # no reference kept: collected once it has failed
        await sleep(5.0)
        return "went on"

    with pytest.raises(KeyError, match="lost"):
        run(loop, main())


def test_an_exception_handler_of_the_runs_own_is_obeyed() -> None:
    loop = VirtualTimeLoop()
    heard: list[str] = []
    loop.set_exception_handler(lambda _, context: heard.append(str(context["exception"])))

    async def main() -> str:
        loop.call_later(1.0, lambda: 1 / 0)
        await sleep(5.0)
        return "went on"

    assert run(loop, main()) == "went on"
    assert heard == ["division by zero"]
