"""Embedding a core without sockets, as embedding.md says, leaves no task behind."""

from __future__ import annotations

import asyncio

import torch
from torch import nn

from asyncsync import LocalTransport, ServerSettings, Worker, build_core


def batches(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(size, 4)
    return x, (x[:, 0] > 0).long()


async def test_a_core_stopped_waited_for_and_closed_leaves_no_task() -> None:
    core = build_core(nn.Linear(4, 2), "asp", 2, ServerSettings(run_id="embedded"))
    workers = [Worker(rank, LocalTransport(core), nn.Linear(4, 2), batches, "asp",
                      run_id="embedded") for rank in range(2)]
    tasks = [asyncio.create_task(worker.run()) for worker in workers]
    while core.store.version < 10:
        await asyncio.sleep(0.01)
    tasks[0].cancel()  # one worker cancelled midway; it leaves on the way out
    await asyncio.gather(tasks[0], return_exceptions=True)
    await core.stop()
    finals = await tasks[1]
    await core.finished.wait()
    await core.close()
    assert finals["steps"] >= 1
    assert [w["state"] for w in core.status()["workers"]] == ["left", "left"]
    assert asyncio.all_tasks() == {asyncio.current_task()}
