"""A worker's join waits at the start barrier for as long as the other workers take.

Before, a join unanswered after the transport's `timeout_s` (600 s by default) ended the
worker with "got no answer": a worker started ten minutes before its peers (a Slurm
node scheduled late) died, and the run then waited for it.
"""

from __future__ import annotations

import asyncio

import pytest

from asyncsync.engine.settings import ServerSettings
from asyncsync.transport.http_client import HttpTransport
from asyncsync.transport.http_server import ParameterServer
from tests.helpers import tiny_model

RUN = "join-waits"


@pytest.mark.parametrize("channel", ["stream", "http"])
async def test_a_join_held_past_the_timeout_is_sent_again_and_answered(channel: str) -> None:
    settings = ServerSettings(run_id=RUN, worker_timeout_s=None)
    async with ParameterServer(tiny_model(), "bsp", 2, settings) as server:
        numel = server.core.store.numel
        early = HttpTransport(server.url, numel, timeout_s=0.5, channel=channel)
        late = HttpTransport(server.url, numel, timeout_s=20, channel=channel)
        try:
            held = asyncio.ensure_future(early.request("join", {"worker": 0, "run_id": RUN}))
            await asyncio.sleep(1.6)  # three timeouts of the early worker's join
            assert not held.done()
            other, _ = await late.request("join", {"worker": 1, "run_id": RUN})
            answer, model = await asyncio.wait_for(held, 20)
            assert model is not None and answer["version"] == 0
            sessions = {answer["meta"]["session"], other["meta"]["session"]}
            assert sessions == {server.core.workers[0].session, server.core.workers[1].session}
            await server.stop()
        finally:
            await early.close()
            await late.close()
