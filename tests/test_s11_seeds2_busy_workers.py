"""Rules found unguarded by mutation testing: WBSP-opt pulls only a newer version; a
DS-Sync group completes with its own members only, and a group of an iteration before a
worker rejoined does not wait for that worker.

WBSP-opt (PROTOCOLS.md): a push's reply says whether a new global model may be pulled;
only then is it pulled and adopted. A fast worker whose slow peer has not published keeps
training from its own model: re-adopting the unchanged global model would throw away
every step it made since (they are in the server's working model, not in the version).

DS-Sync (PROTOCOLS.md): no global barrier; the server waits for the k members of a group
and returns their mean. A rejoined worker starts at the first iteration nobody has
pushed yet; groups of earlier iterations do not wait for it (else they never complete).
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from asyncsync.protocols.base import Push, RunStopped
from asyncsync.protocols.dssync import DsSyncParams, DsSyncServer
from asyncsync.protocols.ports import StepResult
from asyncsync.protocols.testing import FakeContext, FakeStore
from asyncsync.protocols.wbsp import WbspParams, WbspServer
from asyncsync.protocols.wbsp_opt import WbspOptWorker


class YieldingContext(FakeContext):
    """The kit's context, letting background exchanges run before each computation (as
    a worker's compute thread does)."""

    async def steps(self, count: int = 1, batch_size: int | None = None,
                    proximal: tuple[torch.Tensor, float] | None = None,
                    correction: torch.Tensor | None = None) -> StepResult:
        for _ in range(3):  # a push, then a pull: a few turns of the loop
            await asyncio.sleep(0)
        return await super().steps(count, batch_size, proximal, correction)


async def test_wbsp_opt_fast_worker_keeps_its_own_model_until_a_version_is_published() -> None:
    w0 = torch.tensor([2.0, -4.0])
    store = FakeStore(w0.clone(), 2)
    rule = WbspServer(WbspParams(slow_worker=1), store)  # worker 1 never pushes here
    ctx = YieldingContext(store, rule, rank=0, max_steps=10, lr=0.1)
    with pytest.raises(RunStopped):
        await asyncio.wait_for(WbspOptWorker(WbspParams(slow_worker=1)).run(ctx), 5)
    assert store.version == 0
    assert len(ctx.pushed) >= 5  # it pushed along the way, and was never offered a pull
    # |w|^2 / 2 at lr 0.1: each of the 10 steps scales the local model by 0.9
    assert torch.allclose(ctx.local, w0 * 0.9**10)


def model_push(worker: int, iteration: int, value: float) -> Push:
    return Push(worker, 0, "model", torch.full((2,), value), 0, 0, {"iteration": iteration})


async def test_dssync_group_before_a_rejoin_completes_without_the_rejoined_worker() -> None:
    store = FakeStore(torch.zeros(2), 4)
    rule = DsSyncServer(DsSyncParams(), store)  # N = 4, k = 2: {0,1}{2,3}, then {0,3}{1,2}
    for iteration in range(2):
        for worker in (0, 1):
            await rule.on_push(model_push(worker, iteration, 1.0))
    await store.leave(rule, 2)
    await store.join(rule, 2)  # it starts at iteration 2, the first nobody has pushed
    assert (await rule.on_query(2, {}))["iteration"] == 2
    await rule.on_push(model_push(3, 0, 8.0))  # its group {2,3} of iteration 0
    last = rule.averages[-1]
    assert (last.iteration, last.members) == (0, (3,))  # complete with worker 3 alone


async def test_dssync_a_group_completes_without_waiting_for_the_other_groups() -> None:
    store = FakeStore(torch.zeros(2), 4)
    rule = DsSyncServer(DsSyncParams(), store)
    await rule.on_push(model_push(0, 0, 1.0))
    await rule.on_push(model_push(1, 0, 3.0))  # group {0,1}; workers 2 and 3 not pushed
    assert store.version == 1
    last = rule.averages[-1]
    assert (last.iteration, last.members, last.behind) == (0, (0, 1), (2, 3))
    # the evaluated model is the mean of the latest models: (2 + 2 + 0 + 0) / 4
    assert torch.allclose(store.w, torch.full((2,), 1.0))
