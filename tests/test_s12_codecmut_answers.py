"""`BodyPace` moves its deadline by the bytes read and awaited (session 12's mutation
testing found it unguarded): a tensor received in one `read_into` on a slow but honest
link is not answered 408."""

from __future__ import annotations

import asyncio

import pytest

from asyncsync.transport.answers import BodyPace
from asyncsync.wire.frames import WireError

pytestmark = pytest.mark.timeout(60)


async def test_a_read_into_is_given_the_time_its_bytes_take_at_the_slowest_pace() -> None:
    """1000 bytes at a pace of at least 1000 bytes/s after 0.2 s: due by 1.2 s. They come
    after 0.5 s (2000 bytes/s, faster than the pace): answered. They come after 2 s: 408."""
    pace = BodyPace(grace_s=0.2, min_bytes_per_s=1000.0)

    async def read_any() -> bytes:
        return b""

    for delay_s, refused in ((0.5, False), (2.0, True)):
        async def read_into(view: memoryview, delay_s: float = delay_s) -> int:
            await asyncio.sleep(delay_s)
            view[:] = b"\x01" * len(view)
            return len(view)

        _, paced_into = pace.guard(read_any, read_into)
        assert paced_into is not None
        view = memoryview(bytearray(1000))
        if refused:
            with pytest.raises(WireError, match="slower than 1000 bytes/s") as err:
                await paced_into(view)
            assert err.value.status == 408
        else:
            assert await paced_into(view) == 1000 and bytes(view) == b"\x01" * 1000


async def test_chunks_read_at_a_steady_honest_rate_keep_moving_the_deadline() -> None:
    """500 bytes every 0.1 s (5000 bytes/s) against at least 1000 bytes/s after 0.5 s: the
    n-th chunk's first byte is due by 0.5 + (500 (n - 1) + 1) / 1000 s and comes at 0.1 n s,
    so all ten are read, though the later ones come well after the grace alone."""
    pace = BodyPace(grace_s=0.5, min_bytes_per_s=1000.0)

    async def read_any() -> bytes:
        await asyncio.sleep(0.1)
        return b"\x02" * 500

    paced_any, _ = pace.guard(read_any, None)
    assert [len(await paced_any()) for _ in range(10)] == [500] * 10
