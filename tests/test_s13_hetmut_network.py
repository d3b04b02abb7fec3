"""The link model's virtual durations against hand arithmetic (session 13 mutation tests).

Each test kills a plausible bug that the other tests let through: the server's link as
one FIFO queue each way and full duplex, a capacity trace's uplink and downlink kept
apart, a message's pieces and chunks booked back to back but a sender's pause not
credited, a zero-byte booking that does not wait behind the queue, and the kernel's rate
bounds inclusive, the server's rate checked under a capacity trace too.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import pytest

from asyncsync.clock import VirtualTimeLoop
from asyncsync.hetero import network
from asyncsync.hetero.capacity import Capacity
from asyncsync.hetero.network import (
    KERNEL_MBPS,
    Link,
    LinkSpec,
    Pacer,
    ServerLink,
    TracedLinks,
    kernel_rate_problem,
    loss_limited_mbps,
)

MB = 1_000_000
"""At 8 Mbit/s (1 MB/s) a megabyte takes exactly one second."""


def virtual(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run `coroutine` on a fresh virtual clock."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        loop.close()


def test_simultaneous_messages_queue_first_come_first_served() -> None:
    """Three 1 MB pushes booked at t = 0 on a 1 MB/s server link end at 1, 2 and 3 s (the
    docs' "the last of N simultaneous pushes ends at the same time, the first earlier");
    a fourth after the link was idle starts when it is booked."""
    clock = [0.0]
    pacer = Pacer(8.0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(network, "clock_now", lambda: clock[0])
        assert [pacer.reserve(MB) for _ in range(3)] == [1.0, 2.0, 3.0]
        clock[0] = 10.0
        assert pacer.reserve(MB // 2) == 10.5


def test_the_server_link_is_full_duplex() -> None:
    """A push in and a reply out booked at the same moment do not queue behind each other:
    both are through after 1 s, and the next push queues behind the first push only."""
    server = ServerLink(8.0)

    async def book() -> list[float]:
        return [server.incoming.reserve(MB), server.outgoing.reserve(MB),
                server.incoming.reserve(MB)]

    assert virtual(book()) == [1.0, 1.0, 2.0]


def test_a_zero_byte_booking_does_not_wait_behind_the_queue() -> None:
    pacer = Pacer(8.0)

    async def book() -> tuple[float, float]:
        return pacer.reserve(MB), pacer.reserve(0)

    assert virtual(book()) == (1.0, 0.0)


def test_a_capacity_trace_keeps_uplink_and_downlink_apart() -> None:
    """Row up 2 Mbit/s, down 40 Mbit/s: 1 MB up takes 4 s, 1 MB down 0.2 s."""

    class Plain:
        server_mbps = 0.0

        def link(self, rank: int) -> LinkSpec:
            return LinkSpec(latency_ms=5.0)

    traced = TracedLinks(Plain(), "t.csv", [Capacity(7, 0.01, None, 2.0, 40.0)])
    spec = traced.link(0)
    assert (spec.uplink_mbps, spec.downlink_mbps, spec.latency_ms) == (2.0, 40.0, 5.0)
    link = Link(spec)

    async def book() -> tuple[float, float]:
        return link.up.reserve(MB), link.down.reserve(MB)

    assert virtual(book()) == pytest.approx((4.0, 0.2), abs=1e-12)


async def _pieces(count: int) -> AsyncIterator[bytes]:
    for _ in range(count):
        yield bytes(MB // 4)


def test_a_message_in_pieces_takes_its_bytes_over_the_rate() -> None:
    """Four 250 kB pieces up and four chunks down at 8 Mbit/s: 1 s each way, the last
    piece through at 1 s and the last chunk at 2 s."""
    link = Link(LinkSpec(uplink_mbps=8.0, downlink_mbps=8.0))

    async def carry() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        async for _ in link.paced_pieces(_pieces(4)):
            pass
        sent = loop.time()

        async def chunk() -> bytes:
            return bytes(MB // 4)

        read = link.paced_reader(chunk)
        for _ in range(4):
            await read()
        return sent, loop.time()

    assert virtual(carry()) == pytest.approx((1.0, 2.0), abs=1e-9)


def test_a_late_wake_up_within_a_message_costs_no_link_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Real sleeps wake late (here 0.7 ms each): a message of four 250 kB pieces at
    1 MB/s is still through at 1 s each way, its last wake-up 0.7 ms after that, not the
    four wake-ups' 2.8 ms."""
    clock = [0.0]

    async def late_sleep(delay: float) -> None:
        clock[0] += delay + 0.0007

    monkeypatch.setattr(network, "clock_now", lambda: clock[0])
    monkeypatch.setattr(network, "sleep", late_sleep)
    link = Link(LinkSpec(uplink_mbps=8.0, downlink_mbps=8.0))

    async def carry() -> tuple[float, float]:
        async for _ in link.paced_pieces(_pieces(4)):
            pass
        sent = clock[0]

        async def chunk() -> bytes:
            return bytes(MB // 4)

        read = link.paced_reader(chunk)
        for _ in range(4):
            await read()
        return sent, clock[0]

    sent, received = asyncio.run(carry())
    assert sent == pytest.approx(1.0007, abs=1e-9)
    assert received == pytest.approx(1.0007 + 1.0007, abs=1e-9)


def test_a_continuation_after_another_booking_starts_when_it_is_made(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Transfer A's chunk ends at 1.0 s; a 1 kB booking B (1 ms at 1 MB/s) made at 0 s
    behind it ends at 1.001 s; A's next 1 kB chunk, booked at 1.0015 s (within
    `OVERSHOOT_S` of A's end, but the link was last busy until 1.001 s), starts at
    1.0015 s: the link was idle, it cannot be credited back."""
    clock = [0.0]
    monkeypatch.setattr(network, "clock_now", lambda: clock[0])
    pacer = Pacer(8.0)
    first = pacer.reserve(MB)
    assert first == 1.0
    assert pacer.reserve(1000) == pytest.approx(1.001)
    clock[0] = 1.0015
    assert pacer.reserve(1000, first) == pytest.approx(1.0025)


def test_a_sender_that_paused_is_not_credited_the_pause(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A wake-up is up to a millisecond late; a chunk booked 5 ms after its previous one
    ended (the sender paused) starts when it is booked: 1 kB at 1 MB/s ends 6 ms after."""
    clock = [0.0]
    monkeypatch.setattr(network, "clock_now", lambda: clock[0])
    pacer = Pacer(8.0)
    first = pacer.reserve(1000)
    clock[0] = first + 0.005
    assert pacer.reserve(1000, first) == pytest.approx(first + 0.006)


class _Rates:
    """A network section with one worker of uplink `mbps`."""

    server_mbps = 0.0
    uplink_mbps = 1.0
    downlink_mbps = None

    def __init__(self, mbps: float) -> None:
        self.mbps = mbps

    def link(self, rank: int) -> LinkSpec:
        return LinkSpec(uplink_mbps=self.mbps)


@pytest.mark.parametrize("mbps", KERNEL_MBPS)
def test_kernel_shaping_takes_the_bounds_of_its_rates(mbps: float) -> None:
    assert kernel_rate_problem(_Rates(mbps), 1) is None
    assert "network.uplink_mbps" in str(kernel_rate_problem(_Rates(mbps * 1.5 if mbps > 1
                                                                   else mbps / 2), 1))


def test_kernel_shaping_checks_every_traced_worker_and_the_server() -> None:
    class Plain(_Rates):
        server_mbps = 200_000.0

    rows = [Capacity(0, 0.01, None, 10.0, 10.0), Capacity(1, 0.01, None, 10.0, 1e-4)]
    traced = TracedLinks(_Rates(0.0), "t.csv", rows)
    problem = kernel_rate_problem(traced, 2)
    assert problem is not None and "down_mbps" in problem and "rank 1" in problem
    problem = kernel_rate_problem(Plain(10.0), 1)
    assert problem is not None and problem.startswith("network.server_mbps")
    traced = TracedLinks(Plain(0.0), "t.csv", rows[:1])
    assert traced.server_mbps == 200_000.0
    problem = kernel_rate_problem(traced, 1)
    assert problem is not None and problem.startswith("network.server_mbps")


@pytest.mark.parametrize("loss_pct", [-1.0, 100.0, 150.0])
def test_a_loss_rate_outside_0_to_100_percent_is_refused(loss_pct: float) -> None:
    with pytest.raises(ValueError, match=r"loss_pct must be in \[0, 100\)"):
        loss_limited_mbps(0.1, loss_pct)


def test_a_link_with_loss_alone_is_shaped() -> None:
    assert LinkSpec(loss_pct=1.0).shaped
    assert not LinkSpec().shaped
