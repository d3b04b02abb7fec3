"""Bearer-token authentication and the loopback default."""

from __future__ import annotations

import logging

import aiohttp
import pytest
import torch

from asyncsync.engine.channel import RequestRejected
from asyncsync.recipe import TOKEN_ENV, RunSpec
from asyncsync.transport.http_client import HttpTransport
from asyncsync.transport.http_server import ParameterServer, is_loopback
from asyncsync.wire import CONTENT_TYPE, encode_header
from tests.helpers import tiny_model

JOIN = {"worker": 0, "run_id": "run"}


async def test_requests_without_the_token_get_401() -> None:
    async with ParameterServer(tiny_model(), "asp", workers=1, token="s3cret") as server:
        body = encode_header({"run_id": "run"}, None)
        async with aiohttp.ClientSession() as session:
            for headers in ({}, {"Authorization": "Bearer wrong"},
                            {"Authorization": "Basic s3cret"}):
                resp = await session.post(f"{server.url}/v1/status", data=body,
                                          headers={"Content-Type": CONTENT_TYPE, **headers})
                assert resp.status == 401, headers
                assert await resp.text() == "missing or wrong bearer token"
        intruder = HttpTransport(server.url, 0)
        with pytest.raises(RequestRejected) as err:
            await intruder.request("join", JOIN)
        assert err.value.status == 401
        await intruder.close()
        assert not server.core.workers[0].joined
        client = HttpTransport(server.url, server.core.store.numel, token="s3cret")
        reply, vector = await client.request("join", JOIN)
        await client.close()
        assert reply["version"] == 0 and vector is not None
        assert torch.equal(vector, server.core.store.w)


def test_loopback_addresses() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("127.0.0.5") and is_loopback("::1")
    assert is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    assert not is_loopback("node7")


async def test_warning_is_logged_when_exposed(caplog: pytest.LogCaptureFixture) -> None:
    server = ParameterServer(tiny_model(), "asp", workers=1, host="0.0.0.0")
    with caplog.at_level(logging.WARNING, logger="asyncsync.server"):
        await server.start()
        await server.close()
    assert "without a token" in caplog.text


def test_token_comes_from_the_environment_first(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = RunSpec(name="r", token="from-recipe")
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert spec.resolved_token() == "from-recipe"
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    assert spec.resolved_token() == "from-env"
    assert spec.as_table()["token"] == ""  # never written to logs
