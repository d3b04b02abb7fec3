"""The virtual loop where the other clock tests do not look: a timer set in the past, a
delay just under a whole tick, a sleep cancelled at the instant it wakes, a timer's
`when()`, the `watch` cadence, a zero sleep, a timer at infinity, a rebuilt heap, a
failing callback, a cancelled timer, what one iteration runs, and a socket. Expected
values are closed forms (and asyncio's own order)."""

from __future__ import annotations

import asyncio
import math
import random
import socket

import pytest

from asyncsync.clock import VirtualTimeError, VirtualTimeLoop, sleep


def run(loop: VirtualTimeLoop, coroutine: object) -> object:
    try:
        return loop.run_until_complete(coroutine)  # type: ignore[arg-type]
    finally:
        loop.close()


def test_a_timer_set_in_the_past_runs_now_and_time_never_goes_back() -> None:
    """asyncio runs an overdue timer at once; time must not jump back to its instant."""
    loop = VirtualTimeLoop()
    seen: list[float] = []

    async def main() -> float:
        await sleep(2.0)
        loop.call_at(1.0, lambda: seen.append(loop.time()))
        loop.call_later(-0.5, lambda: seen.append(loop.time()))
        await sleep(1.0)
        return loop.time()

    assert run(loop, main()) == 3.0
    assert seen == [2.0, 2.0]


@pytest.mark.parametrize("delay", [1.001, 1.003, 2.017])
def test_a_delay_whose_float_product_falls_under_a_tick_ends_at_its_decimal(
        delay: float) -> None:
    """1.001 x 1e9 is 1000999999.9999999 in floating point: its tick is the nearest one,
    1001000000, so the sleep ends at 1.001, not a nanosecond early."""
    loop = VirtualTimeLoop()

    async def main() -> float:
        await sleep(delay)
        return loop.time()

    assert run(loop, main()) == delay


def test_a_sleep_cancelled_at_the_instant_it_wakes_ends_cancelled() -> None:
    """A timer set first at 1 s cancels the sleeper whose wake-up timer is due at the same
    tick, in the same iteration: the wake-up must find the sleep cancelled and leave it
    so, as ``asyncio.sleep`` does, not fail setting a result on it."""
    loop = VirtualTimeLoop()

    async def sleeper() -> None:
        await sleep(1.0)

    async def main() -> tuple[bool, float]:
        task: list[asyncio.Task[None]] = []
        loop.call_at(1.0, lambda: task[0].cancel())
        task.append(asyncio.create_task(sleeper()))
        await asyncio.gather(task[0], return_exceptions=True)
        return task[0].cancelled(), loop.time()

    assert run(loop, main()) == (True, 1.0)


def test_a_timers_when_is_its_due_time_in_seconds() -> None:
    loop = VirtualTimeLoop()

    async def main() -> tuple[float, float]:
        await sleep(0.25)
        later = loop.call_later(1.25, print)
        at = loop.call_at(4.0, print)
        later.cancel()
        at.cancel()
        return later.when(), at.when()

    assert run(loop, main()) == (1.5, 4.0)


def test_watch_is_called_at_each_jump_a_period_past_its_last_call() -> None:
    """Watched from 10 s with a period of 1 s, over jumps every 0.5 s: called at the jumps
    to 11 s (>= 10 + 1) and 12 s, not at 10.5 s or 11.5 s."""
    loop = VirtualTimeLoop()
    called: list[float] = []

    async def main() -> None:
        await sleep(10.0)
        loop.watch(1.0, lambda: called.append(loop.time()))
        for _ in range(5):
            await sleep(0.5)

    run(loop, main())
    assert called == [11.0, 12.0]


def test_a_zero_sleep_yields_once_as_asyncio_sleep_does() -> None:
    """`sleep(0)` gives way for one iteration, not for a timer due now (which runs only
    after what is ready and then wakes its task one iteration later): two tasks napping 0
    with the two sleeps alternate, the first created first."""
    loop = VirtualTimeLoop()
    order: list[str] = []

    async def napper(name: str, nap: object) -> None:
        for i in range(3):
            await nap(0)  # type: ignore[operator]
            order.append(f"{name}{i}")

    async def main() -> None:
        await asyncio.gather(napper("clock", sleep), napper("asyncio", asyncio.sleep))

    run(loop, main())
    assert order == ["clock0", "asyncio0", "clock1", "asyncio1", "clock2", "asyncio2"]


def test_a_run_left_with_only_a_timer_at_infinity_is_stuck() -> None:
    """A timer that can never be due (a sleep of +inf) must not be jumped to: time would
    become infinite and the sleeper wake. The run is stuck, and says so."""
    loop = VirtualTimeLoop()

    async def forever() -> float:
        await sleep(1.0)
        await sleep(math.inf)
        return loop.time()

    with pytest.raises(VirtualTimeError, match="stuck"):
        run(loop, forever())


def test_timers_left_after_many_are_cancelled_still_run_in_time_order() -> None:
    """Cancelling more than half of over 100 timers has the loop rebuild its heap: the
    timers kept must still run each at its own instant, earliest first."""
    loop = VirtualTimeLoop()
    draw = random.Random(7)
    dues = [draw.randrange(1, 1000) / 10 for _ in range(300)]
    ran: list[tuple[float, float]] = []

    async def main() -> None:
        handles = [loop.call_at(due, lambda due=due: ran.append((loop.time(), due)))
                   for due in dues]
        for handle in handles[::3] + handles[1::3]:  # two thirds cancelled
            handle.cancel()
        await sleep(200.0)

    run(loop, main())
    kept = dues[2::3]
    assert [due for _, due in ran] == sorted(kept)
    assert all(time == due for time, due in ran)


def test_a_failing_callback_ends_the_run_before_the_next_callback_runs() -> None:
    """A timer's exception ends the run at once: a callback due at the same instant, set
    after it, never runs (the simulation does not go on past the failure)."""
    loop = VirtualTimeLoop()
    ran: list[str] = []

    def broken() -> None:
        raise ZeroDivisionError("in a timer")

    async def main() -> None:
        loop.call_later(1.0, broken)
        loop.call_later(1.0, ran.append, "after")
        await sleep(5.0)

    with pytest.raises(ZeroDivisionError):
        run(loop, main())
    assert ran == []


def test_a_cancelled_timer_is_never_jumped_to() -> None:
    """Time moves only to timers that will run: with one at 1 s cancelled, the next jump
    from 0 goes to 5 s, where the watch sees it (as asyncio drops a cancelled head)."""
    loop = VirtualTimeLoop()
    seen: list[float] = []

    async def main() -> None:
        loop.watch(0.5, lambda: seen.append(loop.time()))
        loop.call_later(1.0, print).cancel()
        await sleep(5.0)

    run(loop, main())
    assert seen == [5.0]


def test_callbacks_made_ready_wait_for_the_next_iteration_behind_timers_now_due() -> None:
    """As asyncio: an iteration runs only what was ready when it began; a timer due now
    joins the ready queue at the next iteration, behind what is already there. So a
    call_soon chain started beside a zero-delay timer runs one link, then the timer's
    turn comes after the second link: soon1 (sets the timer, queues soon2), then soon2
    (queues soon3) and the timer, then soon3."""
    loop = VirtualTimeLoop()
    order: list[str] = []

    def soon(k: int) -> None:
        order.append(f"soon{k}")
        if k == 1:
            loop.call_later(0, order.append, "timer")
        if k < 3:
            loop.call_soon(soon, k + 1)

    async def main() -> None:
        loop.call_soon(soon, 1)
        await sleep(1.0)

    run(loop, main())
    assert order == ["soon1", "soon2", "timer", "soon3"]


def test_a_socket_watched_in_virtual_time_is_refused() -> None:
    """A socket's readiness comes in real time, which a virtual loop would jump past."""
    loop = VirtualTimeLoop()
    first, second = socket.socketpair()
    try:
        with pytest.raises(VirtualTimeError, match="sockets"):
            loop.add_reader(first.fileno(), print)
    finally:
        first.close()
        second.close()
        loop.close()
