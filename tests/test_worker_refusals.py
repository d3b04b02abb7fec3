"""A worker refused in its constructor or at its start: a clear error, and no HTTP session
left open (checked with ResourceWarning as an error)."""

from __future__ import annotations

import asyncio
import gc
import socket
import warnings
from typing import Any

import pytest
import torch

from asyncsync.engine.compute import ThreadedWorkerSeam
from asyncsync.engine.settings import ServerSettings
from asyncsync.engine.worker import Worker
from asyncsync.hetero.compute import StaticSlowdown
from asyncsync.protocols.base import Refused
from asyncsync.transport import http_client
from asyncsync.transport.http_server import ParameterServer
from asyncsync.transport.local import LocalTransport
from tests.helpers import batches_of, tiny_data, tiny_model


def test_a_url_in_place_of_a_transport_says_to_use_connect() -> None:
    x, y = tiny_data()
    with pytest.raises(TypeError, match=r"got the string 'http://127\.0\.0\.1:8470': to "
                                        r"reach a server by its URL use Worker\.connect\("
                                        r"rank, url"):
        Worker(0, "http://127.0.0.1:8470", tiny_model(), batches_of(x, y, 0), "bsp")  # type: ignore[arg-type]


def test_something_else_in_place_of_a_transport_names_what_it_lacks() -> None:
    x, y = tiny_data()
    with pytest.raises(TypeError, match=r"got a dict, which lacks request, wire_bytes, "
                                        r"close, bytes_up, bytes_down"):
        Worker(0, {}, tiny_model(), batches_of(x, y, 0), "bsp")  # type: ignore[arg-type]


def unclosed_sessions(caught: list[warnings.WarningMessage]) -> list[str]:
    gc.collect()
    return [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


async def test_a_worker_refused_in_its_constructor_leaves_no_session_open() -> None:
    x, y = tiny_data()
    batches = [(x[:16], y[:16])]  # fixed batches, which lbbsp cannot resize
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="lbbsp assigns batch sizes"):
            Worker.connect(0, "http://127.0.0.1:9", tiny_model(), batches, "lbbsp")
        assert unclosed_sessions(caught) == []


async def test_a_worker_refused_at_its_join_leaves_no_session_open() -> None:
    x, y = tiny_data()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with ParameterServer(tiny_model(), "asp", workers=1, token="s3cret",
                                   settings=ServerSettings(time_s=5)) as server:
            worker = Worker.connect(0, server.url, tiny_model(), batches_of(x, y, 0), "asp",
                                    token="wrong")
            with pytest.raises(Refused):
                await worker.run()
        assert unclosed_sessions(caught) == []


async def test_a_local_transport_is_still_a_transport() -> None:
    x, y = tiny_data()
    from asyncsync.engine.core import build_core

    core = build_core(tiny_model(), "asp", 1, ServerSettings())
    worker = Worker(0, LocalTransport(core), tiny_model(), batches_of(x, y, 0), "asp")
    assert isinstance(worker.transport, LocalTransport)
    await core.close()


class UnreachableTransport(LocalTransport):
    """A server that cannot be reached: every request fails, and is recorded."""

    def __init__(self, core: object) -> None:
        super().__init__(core)  # type: ignore[arg-type]
        self.ops: list[str] = []

    async def request(self, op: str, header: dict[str, Any],
                      vector: torch.Tensor | None = None,
                      ) -> tuple[dict[str, Any], torch.Tensor | None]:
        self.ops.append(op)
        raise ConnectionError("cannot reach the server")


async def test_a_worker_that_never_joined_sends_no_leave() -> None:
    from asyncsync.engine.core import build_core

    x, y = tiny_data()
    core = build_core(tiny_model(), "asp", 1, ServerSettings())
    transport = UnreachableTransport(core)
    worker = Worker(0, transport, tiny_model(), batches_of(x, y, 0), "asp", heartbeat_s=None)
    with pytest.raises(ConnectionError):
        await worker.run()
    assert transport.ops == ["join"]  # not a leave, retried as long again, to no one
    await core.close()


async def test_a_leave_to_an_unreachable_server_is_retried_briefly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http_client, "LEAVE_RETRY_S", 0.2, raising=False)
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    transport = http_client.HttpTransport(f"http://127.0.0.1:{port}", 4,
                                          connect_timeout_s=60.0)
    try:
        with pytest.raises(ConnectionError, match="cannot reach"):
            await asyncio.wait_for(transport.request("leave", {"worker": 0}), 30.0)
    finally:
        await transport.close()


@pytest.mark.parametrize("source", ["generator", "callable"])
@pytest.mark.parametrize("inline_below_s", [0.0, 1.0])
async def test_a_batch_source_that_runs_out_ends_its_worker_with_a_clear_error(
    source: str, inline_below_s: float,
) -> None:
    """StopIteration from the compute thread could not be set on the step's future
    (asyncio's TypeError went to the loop's handler), so the worker waited forever; a step
    on the loop said 'coroutine raised StopIteration'."""
    from asyncsync.engine.core import build_core

    x, y = tiny_data()
    batches: Any = ((x[i : i + 8], y[i : i + 8]) for i in range(0, 16, 8))
    if source == "callable":
        remaining = iter([(x[:8], y[:8])])
        batches = lambda size: next(remaining)  # noqa: E731
    core = build_core(tiny_model(), "asp", 1, ServerSettings(time_s=60.0))
    seam = ThreadedWorkerSeam(StaticSlowdown(1.0), inline_below_s=inline_below_s)
    worker = Worker(0, LocalTransport(core), tiny_model(), batches, "asp", heartbeat_s=None,
                    seam=seam)
    try:
        with pytest.raises(RuntimeError, match="ran out of batches"):
            await asyncio.wait_for(worker.run(), 30.0)
    finally:
        await core.stop()
        await core.close()
