"""Where a real-mode worker's steps run: on the event loop's thread only when that holds
up nothing (see `ThreadedWorkerSeam`), else on the compute thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from asyncsync.engine.settings import ServerSettings
from asyncsync.engine.worker import Worker
from asyncsync.hetero.network import Link, LinkSpec
from asyncsync.transport.http_server import ParameterServer
from tests.helpers import batches_of, tiny_data, tiny_model

COMPUTE_THREAD = "asyncsync-compute"


@contextmanager
def server_in_its_own_thread(protocol: str, time_s: float) -> Iterator[str]:
    """A `ParameterServer` on an event loop of its own thread (as in its own process):
    yields its URL; the run ends after `time_s`."""
    url: list[str] = []
    started = threading.Event()

    def serve() -> None:
        async def main() -> None:
            settings = ServerSettings(lr=0.1, time_s=time_s, eval_interval_s=60.0)
            async with ParameterServer(tiny_model(), protocol, 1, settings) as server:
                url.append(server.url)
                started.set()
                await server.wait_finished()

        asyncio.run(main())

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        assert started.wait(30), "the server did not start"
        yield url[0]
    finally:
        thread.join(60)


class Placement:
    """Records, for each local computation of a worker, the thread it ran on and how many
    of the worker's requests (heartbeats aside) were under way."""

    def __init__(self, worker: Worker) -> None:
        self.steps: list[tuple[str, int]] = []
        self.under_way = 0
        trainer, transport = worker.trainer, worker.transport
        for name in ("gradient", "local_step"):
            setattr(trainer, name, self._noting(getattr(trainer, name)))
        request = transport.request

        async def counted(op: str, header: dict[str, Any], vector: Any = None) -> Any:
            if op == "heartbeat":
                return await request(op, header, vector)
            self.under_way += 1
            try:
                return await request(op, header, vector)
            finally:
                self.under_way -= 1

        transport.request = counted  # type: ignore[method-assign]

    def _noting(self, compute: Callable[..., Any]) -> Callable[..., Any]:
        def noted(*args: Any, **kwargs: Any) -> Any:
            self.steps.append((threading.current_thread().name, self.under_way))
            return compute(*args, **kwargs)

        return noted

    def on_loop(self, loop_thread: str) -> list[int]:
        """The requests under way at each step that ran on `loop_thread`."""
        return [under_way for name, under_way in self.steps if name == loop_thread]


def tiny_worker(url: str, protocol: str, link: Link | None = None) -> Worker:
    x, y = tiny_data()
    return Worker.connect(0, url, tiny_model(), batches_of(x, y, 0), protocol, lr=0.1,
                          batch_size=16, link=link)


async def test_a_lone_bsp_worker_computes_on_its_event_loop() -> None:
    """Nothing else runs on its loop and bsp's exchange has ended when it steps: the
    steps after the first short one run on the loop's own thread (one that took over
    `INLINE_STEP_S`, such as the first, warming up, sends the next to the thread)."""
    with server_in_its_own_thread("bsp", time_s=1.0) as url:
        worker = tiny_worker(url, "bsp")
        placement = Placement(worker)
        await worker.run()
    loop_thread = threading.current_thread().name
    assert len(placement.steps) > 20
    assert placement.steps[0][0].startswith(COMPUTE_THREAD)  # no step measured yet
    assert len(placement.on_loop(loop_thread)) >= 0.9 * len(placement.steps)
    assert not any(placement.on_loop(loop_thread))


async def test_steps_beside_an_exchange_in_flight_run_on_the_compute_thread() -> None:
    """Overlap Local SGD starts its averaging in the background, then steps: over a link
    whose latency outlasts a block of steps, those steps run on the compute thread, and no
    step holds the loop while a request is under way."""
    with server_in_its_own_thread("overlap_local_sgd", time_s=1.5) as url:
        worker = tiny_worker(url, "overlap_local_sgd", Link(LinkSpec(latency_ms=20)))
        placement = Placement(worker)
        await worker.run()
    loop_thread = threading.current_thread().name
    beside = [name for name, under_way in placement.steps if under_way]
    assert len(beside) > 20
    assert all(name.startswith(COMPUTE_THREAD) for name in beside)
    assert placement.on_loop(loop_thread), "no step ran on the loop between exchanges"
    assert not any(placement.on_loop(loop_thread))


async def test_a_worker_sharing_its_loop_with_a_server_computes_on_its_thread() -> None:
    """A server on the same loop answers others while a worker steps: the worker never
    holds the loop for a step."""
    settings = ServerSettings(lr=0.1, time_s=1.0, eval_interval_s=60.0)
    async with ParameterServer(tiny_model(), "bsp", 1, settings) as server:
        worker = tiny_worker(server.url, "bsp")
        placement = Placement(worker)
        await worker.run()
        await server.wait_finished()
    assert len(placement.steps) > 20
    assert all(name.startswith(COMPUTE_THREAD) for name, _ in placement.steps)
