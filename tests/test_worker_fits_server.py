"""A worker tells its server which protocol it runs and its model's size, and runs once.

A bsp worker joined an asp server and trained against it unnoticed; a worker whose model was
larger failed later with a tensor size error. The server refuses such a join (403, with the
reason) when the join says what the worker runs, and the worker now says it. A Worker run a
second time failed with "cannot schedule new futures after shutdown".
"""

from __future__ import annotations

import pytest
import torch

from asyncsync.engine.core import build_core
from asyncsync.engine.settings import ServerSettings
from asyncsync.engine.worker import Worker
from asyncsync.protocols.messages import Forbidden
from asyncsync.transport.local import LocalTransport
from tests.helpers import batches_of, run_workers, tiny_data, tiny_model


def worker_for(core: object, protocol: str, model: torch.nn.Module, max_steps: int = 4,
               ) -> Worker:
    x, y = tiny_data()
    return Worker(0, LocalTransport(core), model, batches_of(x, y, 0),  # type: ignore[arg-type]
                  protocol, max_steps=max_steps, heartbeat_s=None)


async def test_a_worker_of_another_protocol_is_refused_with_the_reason() -> None:
    core = build_core(tiny_model(), "asp", 1, ServerSettings(time_s=5))
    with pytest.raises(Forbidden, match="this server runs protocol 'asp', the worker 'bsp'"):
        await run_workers(core, [worker_for(core, "bsp", tiny_model())])
    assert core.store.version == 0


async def test_a_worker_with_another_model_size_is_refused_with_the_reason() -> None:
    core = build_core(tiny_model(), "asp", 1, ServerSettings(time_s=5))
    larger = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(8, 3))
    with pytest.raises(Forbidden, match="the worker's model has 27 values, the server's 178"):
        await run_workers(core, [worker_for(core, "asp", larger)])
    assert core.store.version == 0


async def test_a_worker_runs_once() -> None:
    core = build_core(tiny_model(), "asp", 1, ServerSettings(time_s=5))
    worker = worker_for(core, "asp", tiny_model())
    (final,) = await run_workers(core, [worker])
    assert final["steps"] == 4
    with pytest.raises(RuntimeError, match="a Worker runs once"):
        await worker.run()
