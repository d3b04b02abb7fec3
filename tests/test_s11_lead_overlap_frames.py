"""`push_then_pull` (the exchange of Overlap Local SGD and Streaming DiLoCo) does not keep
the pushed vector alive while its pull waits: in a population, a worker's exchange may wait
for many rounds."""

from __future__ import annotations

import torch

from asyncsync.protocols.asp import AspParams, AspServer
from asyncsync.protocols.overlap import push_then_pull
from asyncsync.protocols.testing import FakeStore
from tests.test_s11_retain2_async_frames import WatchedContext


async def test_the_pushed_vector_is_not_held_while_the_pull_waits() -> None:
    store = FakeStore(torch.ones(4), workers=1)
    ctx = WatchedContext(store, AspServer(AspParams(), store))
    # the caller holds no reference either: only the exchange's frame could keep it alive
    await push_then_pull(ctx, "gradient", torch.full((4,), 0.5), steps=1, samples=1,
                         base_version=0)
    assert ctx.alive_at_pull == [0]
