"""An embedding program gets its collector settings back, or keeps them untouched
(`asyncsync.transport.gc_tuning`, docs/embedding.md)."""

from __future__ import annotations

import gc
import socket
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from asyncsync import ParameterServer
from asyncsync.transport import gc_tuning
from asyncsync.transport.http_client import HttpTransport

PROGRAMS_OWN = (700, 10, 10)  # Python's defaults, as a program that never touched them has
TUNED_YOUNG = 20_000  # docs/embedding.md: the young threshold while a server is open


@pytest.fixture(autouse=True)
def fresh_process_settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No hold open and the collector at the defaults, as in a program's own process; the
    test process's settings are put back afterwards."""
    monkeypatch.setattr(gc_tuning, "_holds", 0, raising=False)
    monkeypatch.setattr(gc_tuning, "_restore", None, raising=False)
    monkeypatch.setattr(gc_tuning, "_enabled", True, raising=False)
    saved = gc.get_threshold()
    gc.set_threshold(*PROGRAMS_OWN)
    yield
    gc.set_threshold(*saved)


def server() -> ParameterServer:
    torch.manual_seed(0)
    return ParameterServer(nn.Linear(4, 2), "asp", 1)


async def test_closing_the_last_server_puts_the_programs_threshold_back() -> None:
    first, second = server(), server()
    await first.start()
    await second.start()
    assert gc.get_threshold() == (TUNED_YOUNG, 10, 10)
    await first.close()
    assert gc.get_threshold() == (TUNED_YOUNG, 10, 10)  # the second still serves
    await second.close()
    assert gc.get_threshold() == PROGRAMS_OWN


async def test_an_http_worker_holds_the_settings_from_its_first_request_to_its_close(
) -> None:
    unused = HttpTransport("http://127.0.0.1:9", numel=10)  # never used: holds nothing
    host = server()
    url = await host.start()
    transport = HttpTransport(url, numel=10)
    reply, _ = await transport.request("status", {})
    assert "workers" in reply
    await host.close()
    assert gc.get_threshold() == (TUNED_YOUNG, 10, 10)
    await transport.close()
    await transport.close()  # a second close ends no other hold
    assert gc.get_threshold() == PROGRAMS_OWN
    await unused.close()


async def test_a_threshold_the_program_set_meanwhile_is_kept() -> None:
    host = server()
    await host.start()
    gc.set_threshold(5_000, 20, 20)
    await host.close()
    assert gc.get_threshold() == (5_000, 20, 20)


async def test_a_start_that_cannot_listen_holds_nothing() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = ParameterServer(nn.Linear(4, 2), "asp", 1, port=taken.getsockname()[1])
        with pytest.raises(OSError):
            await busy.start()
    assert gc.get_threshold() == PROGRAMS_OWN
    await busy.close()
    assert gc.get_threshold() == PROGRAMS_OWN


async def test_set_enabled_false_leaves_the_collector_alone() -> None:
    gc_tuning.set_enabled(False)
    frozen = gc.get_freeze_count()
    host = server()
    await host.start()
    assert gc.get_threshold() == PROGRAMS_OWN
    await host.close()
    assert gc.get_threshold() == PROGRAMS_OWN
    assert gc.get_freeze_count() <= frozen  # nothing newly frozen (some frozen ones died)
