"""Link emulation paces the real bytes of HTTP requests."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
import torch

from asyncsync.clock import VirtualTimeLoop
from asyncsync.engine.settings import ServerSettings
from asyncsync.hetero import network
from asyncsync.hetero.network import Link, LinkSpec
from asyncsync.study.assembly import build_worker, worker_link
from asyncsync.study.hetero_specs import NetworkSpec
from asyncsync.study.specs import ModelSpec, RunSpec
from asyncsync.transport.http_client import HttpTransport
from asyncsync.transport.http_server import ParameterServer
from tests.helpers import tiny_model


async def timed_push(server: ParameterServer, link: Link | None, vector: torch.Tensor) -> float:
    transport = HttpTransport(server.url, vector.numel(), link=link)
    try:
        joined, _ = await transport.request("join", {"worker": 0, "run_id": "net"})
        session = {"worker": 0, "run_id": "net", "session": joined["meta"]["session"]}
        header = {**session, "base_version": joined["version"], "kind": "gradient",
                  "steps": 1, "samples": 1}
        began = time.monotonic()
        await transport.request("push", header, vector)
        seconds = time.monotonic() - began
        await transport.request("leave", session)  # the next timed push joins as rank 0
        return seconds
    finally:
        await transport.close()


def assert_paced(seconds: float, expected: float, unpaced: float) -> None:
    """A paced transfer takes at least the link's time, and at most half as long again
    plus what the same transfer took unpaced in the same test.

    The slack is the host's: a chunk's wake-up more than `network.OVERSHOOT_S` late counts
    as the sender pausing, as it should, and with every core busy that added a sixth to a
    fifth of a 1 s pull here. A link paced at the wrong rate (half of it, or none) still
    fails.
    """
    assert expected * 0.95 <= seconds <= expected * 1.5 + unpaced, (seconds, expected,
                                                                     unpaced)


async def test_45_mb_push_over_100_mbit_uplink_takes_3_6_s() -> None:
    model = torch.nn.Linear(1125, 10_000)  # 11.26 M floats = 45.0 MB
    async with ParameterServer(model, "asp", 1, ServerSettings(run_id="net")) as server:
        vector = torch.full((server.core.store.numel,), 1e-3)
        megabytes = vector.nbytes / 1e6
        assert 44.9 < megabytes < 45.1
        unpaced = await timed_push(server, None, vector)
        seconds = await timed_push(server, Link(LinkSpec(uplink_mbps=100)), vector)
    assert_paced(seconds, megabytes * 8 / 100, unpaced)


async def test_latency_adds_to_each_request() -> None:
    async with ParameterServer(tiny_model(), "asp", 1, ServerSettings(run_id="net")) as server:
        vector = torch.zeros(server.core.store.numel)
        plain = await timed_push(server, None, vector)
        delayed = await timed_push(server, Link(LinkSpec(latency_ms=60)), vector)
    assert delayed >= 0.12  # one-way latency is paid on the way out and on the way back
    assert delayed - plain >= 0.11


def test_network_spec_resolves_per_worker_links() -> None:
    spec = NetworkSpec(bandwidth_mbps=[10.0, 20.0], downlink_mbps=5.0, latency_ms=30.0)
    assert spec.link(0) == LinkSpec(10.0, 5.0, 30.0, 0.0)
    assert spec.link(1) == LinkSpec(20.0, 5.0, 30.0, 0.0)
    assert spec.link(2) == LinkSpec(0.0, 5.0, 30.0, 0.0)
    assert not NetworkSpec().link(0).shaped


async def timed_pull(server: ParameterServer, link: Link | None) -> tuple[float, int]:
    transport = HttpTransport(server.url, server.core.store.numel, link=link)
    try:
        joined, _ = await transport.request("join", {"worker": 0, "run_id": "net"})
        session = {"worker": 0, "run_id": "net", "session": joined["meta"]["session"]}
        began = time.monotonic()
        _, vector = await transport.request("pull", {**session, "base_version": 0})
        seconds = time.monotonic() - began
        await transport.request("leave", session)  # the next timed pull joins as rank 0
    finally:
        await transport.close()
    assert vector is not None
    return seconds, vector.numel()


async def test_downlink_paces_pulls() -> None:
    model = torch.nn.Linear(250, 10_000)  # 2.5 M floats = 10 MB
    async with ParameterServer(model, "asp", 1, ServerSettings(run_id="net")) as server:
        numel = server.core.store.numel
        unpaced, _ = await timed_pull(server, None)
        seconds, pulled = await timed_pull(server, Link(LinkSpec(downlink_mbps=80)))
    assert pulled == numel
    assert_paced(seconds, numel * 4 * 8 / 80e6, unpaced)  # 1.0 s


def virtual_delays(link: Link, count: int = 8) -> list[float]:
    """The virtual seconds each of `count` one-way delays of `link` takes."""

    async def measure() -> list[float]:
        loop = asyncio.get_running_loop()
        out = []
        for _ in range(count):
            began = loop.time()
            await link.one_way_delay()
            out.append(loop.time() - began)
        return out

    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(measure())
    finally:
        loop.close()


def test_jitter_is_bounded_and_seeded() -> None:
    def delays(seed: int) -> list[float]:
        return virtual_delays(Link(LinkSpec(latency_ms=10, jitter_ms=20), seed=seed))

    first = delays(3)
    draws = random.Random(3)
    assert first == pytest.approx([0.010 + draws.uniform(0, 20) / 1000 for _ in range(8)])
    assert all(0.010 <= d <= 0.030 for d in first), first  # latency + U[0, jitter]
    assert delays(3) == first
    assert delays(4) != first


def real_worker_link(seed: int, rank: int) -> Link | None:
    """The link `build_worker` gives worker `rank` of a real-clock run seeded `seed`."""
    spec = RunSpec(name="r", workers=2, seed=seed, model=ModelSpec(name="mlp"),
                   network=NetworkSpec(latency_ms=5.0, jitter_ms=20.0))

    async def build() -> Link | None:
        worker = build_worker(spec, rank, "http://127.0.0.1:9", "run", None)
        await worker.transport.close()
        worker.seam.close()
        assert isinstance(worker.transport, HttpTransport)
        return worker.transport.link

    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(build())
    finally:
        loop.close()


def test_real_mode_jitter_follows_the_run_seed_like_virtual_mode() -> None:
    seeds = {}
    for seed in (1, 2):
        link = real_worker_link(seed, rank=1)
        assert link is not None
        seeds[seed] = virtual_delays(link)
        # the same seed rule as a virtual run: seed * 1000 + rank
        virtual = worker_link(RunSpec(name="r", workers=2, seed=seed,
                                      network=NetworkSpec(latency_ms=5.0, jitter_ms=20.0)), 1)
        assert virtual is not None
        assert virtual_delays(virtual) == seeds[seed]
    assert seeds[1] != seeds[2]  # repeats with other seeds draw other jitter


def test_a_late_wake_up_does_not_slow_the_rest_of_a_transfer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """1 MB/s: each 1000-byte chunk takes 1 ms. A transfer whose sleeps wake 0.7 ms late
    still ends at 10 ms after 10 chunks; an unrelated booking, or one after the link was
    idle, starts when it is made."""
    clock = [0.0]
    monkeypatch.setattr(network, "clock_now", lambda: clock[0])
    pacer = network.Pacer(8.0)
    through = None
    for _ in range(10):
        through = pacer.reserve(1000, through)
        clock[0] = through + 0.0007  # the sleep until `through` woke late
    assert through == pytest.approx(0.010)
    last = pacer.reserve(1000)  # not a continuation: starts now
    assert last == pytest.approx(clock[0] + 0.001)
    clock[0] = last + 0.5  # idle link: a continuation after a long gap starts now
    assert pacer.reserve(1000, last) == pytest.approx(clock[0] + 0.001)
