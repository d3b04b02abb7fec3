"""Embedding a `ParameterServer` in one's own program: where it listens, and the errors
for calls made in the wrong order (each names what to do instead)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from asyncsync.cli import main
from asyncsync.engine.settings import ServerSettings
from asyncsync.transport.http_server import ParameterServer
from tests.helpers import tiny_model


@pytest.mark.parametrize("host", [None, "", 5, b"127.0.0.1"])
def test_a_host_that_is_not_an_address_is_refused(host: object) -> None:
    """(asyncio reads None and "" as every interface: a server given one listened beyond
    loopback without being asked.)"""
    with pytest.raises(ValueError, match="host"):
        ParameterServer(tiny_model(), "asp", 1, host=host)  # type: ignore[arg-type]


async def test_every_socket_listens_on_loopback_by_default() -> None:
    async with ParameterServer(tiny_model(), "asp", 1) as server:
        assert server._listener is not None
        addresses = {sock.getsockname()[0] for sock in server._listener.sockets}
    assert addresses == {"127.0.0.1"}


@pytest.mark.parametrize(("argument", "value"), [
    ("model", None), ("settings", {"lr": 0.1}), ("tls", "cert.pem"),
    ("connections", {"max_connections": 3}),
])
def test_an_argument_of_the_wrong_kind_is_named(argument: str, value: object) -> None:
    """(Each was an AttributeError from deep inside, or accepted until start.)"""
    args: dict[str, object] = {"model": tiny_model(), argument: value}
    model = args.pop("model")
    with pytest.raises(ValueError, match=f"^{argument} must be"):
        ParameterServer(model, "asp", 1, **args)  # type: ignore[arg-type]


async def test_the_url_of_a_server_on_a_free_port_is_known_once_started() -> None:
    server = ParameterServer(tiny_model(), "asp", 1)
    with pytest.raises(RuntimeError, match=r"await server.start\(\)"):
        _ = server.url  # it was http://127.0.0.1:0, which workers dialled for a minute
    url = await server.start()
    try:
        assert server.url == url and not url.endswith(":0")
    finally:
        await server.close()
    assert ParameterServer(tiny_model(), "asp", 1, port=8470).url == "http://127.0.0.1:8470"


async def test_waiting_for_a_server_never_started_is_an_error_not_a_hang() -> None:
    server = ParameterServer(tiny_model(), "asp", 1)
    with pytest.raises(RuntimeError, match="start"):
        await asyncio.wait_for(server.wait_finished(), 10)
    await server.close()


async def test_a_server_starts_once_and_not_after_close() -> None:
    server = ParameterServer(tiny_model(), "asp", 1)
    url = await server.start()
    with pytest.raises(RuntimeError, match=f"already listening at {url}"):
        await server.start()  # it was an OSError: address already in use
    await server.close()
    with pytest.raises(RuntimeError, match="closed"):
        await server.start()  # it served a stopped run again


async def test_a_server_whose_port_is_taken_says_so_and_leaves_nothing_open() -> None:
    async with ParameterServer(tiny_model(), "asp", 1) as first:
        second = ParameterServer(tiny_model(), "asp", 1, port=first.port)
        with pytest.raises(OSError, match=str(first.port)):
            await second.start()
        assert second._runner is None
        await second.close()


async def test_closing_a_run_that_was_not_stopped_warns_that_workers_are_left_retrying(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = ParameterServer(tiny_model(), "asp", 1, ServerSettings(run_id="r"))
    await server.start()
    await server.core.handle("join", {"worker": 0, "run_id": "r"}, None)
    await server.close()
    assert "closing with workers 0 still in the run" in caplog.text
    assert "stop() and wait_finished() before close()" in caplog.text


def test_the_server_command_refuses_an_empty_host_with_one_error_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """(`asyncsync server --host ""` listened on every interface; with the check above it
    was a traceback.)"""
    recipe = Path(__file__).parent.parent / "recipes" / "quickstart.toml"
    assert main(["server", "--recipe", str(recipe), "--run", "bsp", "--host", "",
                 "--port", "0"]) == 2
    err = capsys.readouterr()
    assert "error:" in err.out + err.err and "host must be a non-empty str" in err.out + err.err
    assert "Traceback" not in err.out + err.err
