"""Link heterogeneity: bandwidth, latency and jitter applied to the bytes a worker moves.

A `Link` paces real transfers: the HTTP client waits after each chunk it sends or receives
until the link's rate allows the next one (a token bucket of one chunk), so a slow uplink
also back-pressures the socket. Latency is one-way, netem style: it is paid before a
request goes out and again before its reply is read, so every request costs at least
``2 * latency`` on top of its transfer time. Jitter adds a seeded uniform draw in
``[0, jitter]`` to each one-way delay.

Loss (`LinkSpec.loss_pct`, random packet loss in each direction) is not dropped here: it
caps the link's rate at what TCP's congestion avoidance sustains under that loss,
``MSS / RTT * C / sqrt(p)`` with ``C = sqrt(3/2)`` (Mathis, Semke, Mahdavi and Ott, "The
macroscopic behavior of the TCP congestion avoidance algorithm", ACM SIGCOMM CCR 27(3),
1997), for a loss-based congestion control (Reno, CUBIC in its TCP-friendly region).
Slow start, timeouts and the kernel's queues are not modelled.
"""

from __future__ import annotations

import math
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Protocol

from asyncsync.clock import now as clock_now
from asyncsync.clock import sleep
from asyncsync.hetero.capacity import LINK_COLUMNS, Capacity
from asyncsync.wire.frames import ReadAny

EMULATIONS = ("app", "kernel")
"""Who shapes a real run's links: the client's pacing here (app) or tc qdiscs (kernel)."""

KERNEL_MBPS = (0.001, 100_000.0)
"""The rates, Mbit/s, that kernel shaping (a tc ``tbf``) takes: below 1 kbit/s a link's
16 KiB burst lasts longer than tc's timer can count (tc then shrinks the burst below one
packet, and the link carries nothing); above 100 Gbit/s its queue outgrows tc's 32-bit
byte counts (and any veth's speed)."""

MSS_BYTES = 1448
"""TCP's segment payload on an Ethernet MTU of 1500 (IP 20, TCP 20, timestamps 12 bytes)."""

MATHIS_C = math.sqrt(3 / 2)
"""Mathis et al.'s constant for periodic loss with an ACK per segment."""


def loss_limited_mbps(round_trip_s: float, loss_pct: float) -> float:
    """TCP's sustained rate in Mbit/s under random loss `loss_pct` (%) at round trip
    `round_trip_s`: ``MSS / RTT * C / sqrt(p)`` (Mathis et al. 1997; inf without loss)."""
    if not 0 <= loss_pct < 100:
        raise ValueError(f"loss_pct must be in [0, 100), got {loss_pct}")
    if loss_pct == 0:
        return math.inf
    if round_trip_s <= 0:
        raise ValueError("a loss-limited rate needs a round trip > 0")
    return MSS_BYTES * 8 / round_trip_s * MATHIS_C / math.sqrt(loss_pct / 100) / 1e6


@dataclass(frozen=True)
class LinkSpec:
    """One worker's link; 0 means unlimited bandwidth, no delay or no loss."""

    uplink_mbps: float = 0.0
    downlink_mbps: float = 0.0
    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_pct: float = 0.0

    def __post_init__(self) -> None:
        for name in ("uplink_mbps", "downlink_mbps", "latency_ms", "jitter_ms"):
            value = getattr(self, name)
            if not 0 <= value < math.inf:
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if not 0 <= self.loss_pct < 100:
            raise ValueError(f"loss_pct must be in [0, 100), got {self.loss_pct}")

    @property
    def shaped(self) -> bool:
        return any((self.uplink_mbps, self.downlink_mbps, self.latency_ms, self.jitter_ms,
                    self.loss_pct))

    @property
    def round_trip_s(self) -> float:
        """The mean round trip: both one-way delays with their mean jitter."""
        return (2 * self.latency_ms + self.jitter_ms) / 1000

    def effective_mbps(self, mbps: float) -> float:
        """A direction's rate given as `mbps` (0: unlimited) capped by the loss-limited
        rate (0 again when neither limits it)."""
        if not self.loss_pct:
            return mbps
        capped = loss_limited_mbps(self.round_trip_s, self.loss_pct)
        return min(mbps, capped) if mbps else capped


class Links(Protocol):
    """A network section (`asyncsync.study.hetero_specs.NetworkSpec`): each worker's link
    and the server's; ``uplink_mbps`` / ``downlink_mbps`` None where ``bandwidth_mbps``
    sets them."""

    @property
    def server_mbps(self) -> float: ...

    def link(self, rank: int) -> LinkSpec: ...


@dataclass(frozen=True)
class TracedLinks:
    """A run's network keys with each worker's rates from its row of capacity trace
    `trace` (which the recipe may not set too)."""

    network: Links
    trace: str
    rows: list[Capacity]

    @property
    def server_mbps(self) -> float:
        return self.network.server_mbps

    def link(self, rank: int) -> LinkSpec:
        row = self.rows[rank]
        return replace(self.network.link(rank), uplink_mbps=row.up_mbps,
                       downlink_mbps=row.down_mbps)


def kernel_rate_problem(network: Links, workers: int) -> str | None:
    """The first rate of `network` that kernel shaping cannot shape (`KERNEL_MBPS`), as
    ``network.<key>: <problem>`` (a trace's: its file, row and column); None when every
    rate can be shaped."""
    low, high = KERNEL_MBPS
    if isinstance(network, TracedLinks):
        for rank, row in enumerate(network.rows[:workers]):
            for column in LINK_COLUMNS:
                if not low <= (mbps := getattr(row, column)) <= high:
                    return (f"capacity.trace {network.trace}: worker {row.row}'s {column} = "
                            f"{mbps:g} (rank {rank}) is outside the rates emulation = "
                            f"\"kernel\" shapes, {low:g} to {high:g} Mbit/s")
    rates = [("server_mbps", "the server's link", network.server_mbps)]
    for rank in range(workers):
        link = network.link(rank)
        rates += [(_rate_key(network, "uplink_mbps"), f"worker {rank}'s uplink",
                   link.uplink_mbps),
                  (_rate_key(network, "downlink_mbps"), f"worker {rank}'s downlink",
                   link.downlink_mbps)]
    for key, what, mbps in rates:
        if mbps and not low <= mbps <= high:
            return (f"network.{key}: {mbps:g} Mbit/s ({what}) is outside the rates "
                    f"emulation = \"kernel\" shapes, {low:g} to {high:g} Mbit/s "
                    "(0 = unlimited)")
    return None


def _rate_key(network: Links, direction: str) -> str:
    """The recipe key that set `direction`'s rate (it, or ``bandwidth_mbps``)."""
    return direction if getattr(network, direction, None) is not None else "bandwidth_mbps"


OVERSHOOT_S = 0.002
"""How late a wake-up may be and still count as a transfer's previous chunk ending on time."""


class Pacer:
    """Spaces out bytes so that they leave at most at `mbps` megabits per second (0: no
    limit); transfers that overlap queue behind each other.

    A transfer's next chunk, booked within `OVERSHOOT_S` of the end of its previous one
    (`follows`), follows it back to back: a real sleep wakes up to a millisecond late (the
    selector's timeout resolution), and without this every chunk of a message would add
    that lateness to the link's time. In virtual time wake-ups are exact, so nothing
    changes there.
    """

    def __init__(self, mbps: float) -> None:
        self.bytes_per_s = mbps * 1e6 / 8
        self._free_at = 0.0

    def reserve(self, nbytes: int, follows: float | None = None) -> float:
        """Book `nbytes` on this pacer; returns the time (on the one clock) they are through.

        `follows`: the end of the same transfer's previous booking, if it has one.
        """
        now = clock_now()
        if self.bytes_per_s <= 0 or nbytes <= 0:
            return now
        on_time = follows is not None and follows == self._free_at \
            and now - follows <= OVERSHOOT_S
        start = self._free_at if on_time else max(self._free_at, now)
        self._free_at = start + nbytes / self.bytes_per_s
        return self._free_at

    async def sent(self, nbytes: int, follows: float | None = None) -> float:
        """Wait until `nbytes` are through; returns when that was booked for."""
        through = self.reserve(nbytes, follows)
        await sleep_until(through)
        return through


async def sleep_until(moment: float) -> None:
    """Sleep until `moment` on the one clock (at once if it has passed)."""
    delay = moment - clock_now()
    if delay > 0:
        await sleep(delay)


class ServerLink:
    """The parameter server's own network interface, shared by every worker's transfers:
    `incoming` carries pushes, `outgoing` replies (full duplex, `mbps` each way). A message
    is through when both its worker's link and the server's have carried it."""

    def __init__(self, mbps: float) -> None:
        if not 0 <= mbps < math.inf:
            raise ValueError(f"server_mbps must be a finite number >= 0, got {mbps}")
        self.incoming = Pacer(mbps)
        self.outgoing = Pacer(mbps)


class Link:
    """The emulated link of one worker (both directions)."""

    def __init__(self, spec: LinkSpec, seed: int = 0) -> None:
        self.spec = spec
        self.up = Pacer(spec.effective_mbps(spec.uplink_mbps))
        self.down = Pacer(spec.effective_mbps(spec.downlink_mbps))
        # Drawn from only with jitter; a generator's state is 2.5 kB, a lot times 100,000.
        self._random = random.Random(seed) if spec.jitter_ms else None

    async def one_way_delay(self) -> None:
        delay = self.spec.latency_ms
        if self._random is not None:
            delay += self._random.uniform(0.0, self.spec.jitter_ms)
        if delay > 0:
            await sleep(delay / 1000)

    def paced_pieces(
        self, pieces: AsyncIterator[bytes | memoryview]
    ) -> AsyncIterator[bytes | memoryview]:
        """Let each outgoing piece leave only when the uplink's rate allows it."""

        async def paced() -> AsyncIterator[bytes | memoryview]:
            through = None
            async for piece in pieces:
                through = await self.up.sent(len(piece), through)
                yield piece

        return paced()

    def paced_reader(self, read_any: ReadAny) -> ReadAny:
        """Deliver each incoming chunk only once the downlink's rate has carried it."""

        through: float | None = None

        async def read() -> bytes:
            nonlocal through
            chunk = await read_any()
            through = await self.down.sent(len(chunk), through)
            return chunk

        return read
