"""Link heterogeneity: bandwidth, latency and jitter applied to the bytes a worker moves.

A `Link` paces real transfers: the HTTP client waits after each chunk it sends or receives
until the link's rate allows the next one (a token bucket of one chunk), so a slow uplink
also back-pressures the socket. Latency is one-way, netem style: it is paid before a
request goes out and again before its reply is read, so every request costs at least
``2 * latency`` on top of its transfer time. Jitter adds a seeded uniform draw in
``[0, jitter]`` to each one-way delay.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from dataclasses import dataclass

from asyncsync.clock import now as clock_now
from asyncsync.clock import sleep
from asyncsync.wire.frames import ReadAny


@dataclass(frozen=True)
class LinkSpec:
    """One worker's link; 0 means unlimited bandwidth or no delay."""

    uplink_mbps: float = 0.0
    downlink_mbps: float = 0.0
    latency_ms: float = 0.0
    jitter_ms: float = 0.0

    def __post_init__(self) -> None:
        for name in ("uplink_mbps", "downlink_mbps", "latency_ms", "jitter_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    @property
    def shaped(self) -> bool:
        return any((self.uplink_mbps, self.downlink_mbps, self.latency_ms, self.jitter_ms))


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
        if mbps < 0:
            raise ValueError(f"server_mbps must be >= 0, got {mbps}")
        self.incoming = Pacer(mbps)
        self.outgoing = Pacer(mbps)


class Link:
    """The emulated link of one worker (both directions)."""

    def __init__(self, spec: LinkSpec, seed: int = 0) -> None:
        self.spec = spec
        self.up = Pacer(spec.uplink_mbps)
        self.down = Pacer(spec.downlink_mbps)
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
