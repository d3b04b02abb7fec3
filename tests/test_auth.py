"""Bearer-token authentication and the loopback default."""

from __future__ import annotations

import logging

import aiohttp
import pytest
import torch

from asyncsync.cli import main
from asyncsync.engine.channel import RequestRejected
from asyncsync.protocols.base import Forbidden
from asyncsync.study.assembly import WORKER_TOKEN_ENV, run_worker_token
from asyncsync.study.launch import TOKEN_ENV
from asyncsync.study.nodes import node_env
from asyncsync.study.specs import RunSpec
from asyncsync.transport.http_client import HttpTransport
from asyncsync.transport.http_server import ParameterServer, is_loopback
from asyncsync.transport.tokens import worker_token
from asyncsync.wire.frames import CONTENT_TYPE, encode_header
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


async def test_a_worker_token_cannot_stop_the_run() -> None:
    async with ParameterServer(tiny_model(), "asp", workers=1, token="run-secret") as server:
        worker = HttpTransport(server.url, server.core.store.numel,
                               token=worker_token("run-secret"))
        reply, _ = await worker.request("join", JOIN)
        assert reply["version"] == 0
        status, _ = await worker.request("status", {"run_id": "run"})
        assert "workers" in status
        with pytest.raises(Forbidden, match="run token"):
            await worker.request("stop", {"run_id": "run"})
        await worker.close()
        assert not server.core.store.stopping
        operator = HttpTransport(server.url, 0, token="run-secret")
        reply, _ = await operator.request("stop", {"run_id": "run"})
        await operator.close()
        assert reply["stop"] and server.core.store.stopping


def test_workers_get_the_worker_token_never_the_run_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(TOKEN_ENV, "set-in-the-shell")
    server_env, worker_env = node_env("run-secret", True), node_env("run-secret", False)
    assert server_env[TOKEN_ENV] == "run-secret" and WORKER_TOKEN_ENV not in server_env
    assert TOKEN_ENV not in worker_env
    assert worker_env[WORKER_TOKEN_ENV] == worker_token("run-secret") != "run-secret"
    spec = RunSpec(name="r")  # a worker node: its own token, else derived from the run's
    monkeypatch.delenv(TOKEN_ENV)
    assert run_worker_token(spec) is None
    monkeypatch.setenv(TOKEN_ENV, "run-secret")
    assert run_worker_token(spec) == worker_token("run-secret")
    monkeypatch.setenv(WORKER_TOKEN_ENV, "handed-out")
    assert run_worker_token(spec) == "handed-out"


def test_the_cli_prints_the_worker_token(monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(TOKEN_ENV, "run-secret")
    assert main(["worker-token"]) == 0
    assert capsys.readouterr().out == worker_token("run-secret") + "\n"
    monkeypatch.delenv(TOKEN_ENV)
    assert main(["worker-token"]) == 2
