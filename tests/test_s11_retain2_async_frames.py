"""An asynchronous worker waiting on its next pull holds nothing it pulled or pushed before.

The population census (test_s11_retain2_population_memory) cannot tell EASGD's
asynchronous loop apart before and after the fix: a worker keeping the last center and
difference holds 3 vectors, as many as a worker with a push in transit may. Here the vectors
the loop pulled and pushed are watched by weak reference at each of its pulls instead.
"""

from __future__ import annotations

import gc
import weakref
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from asyncsync.protocols.base import RunStopped, ServerRule, WorkerLoop
from asyncsync.protocols.easgd import EasgdAsyncServer, EasgdAsyncWorker, EasgdParams
from asyncsync.protocols.fedasync import FedAsyncParams, FedAsyncServer, FedAsyncWorker
from asyncsync.protocols.testing import FakeContext, FakeStore

ROUNDS = 3
STEPS = 2


@dataclass
class WatchedContext(FakeContext):
    """A `FakeContext` that counts, at each pull, the earlier pulled and pushed vectors
    still alive."""

    watched: list[weakref.ref[torch.Tensor]] = field(default_factory=list)
    alive_at_pull: list[int] = field(default_factory=list)

    async def push(self, kind: str, vector: torch.Tensor, steps: int, samples: int,
                   meta: dict[str, Any] | None = None,
                   base_version: int | None = None) -> dict[str, Any]:
        self.watched.append(weakref.ref(vector))
        return await super().push(kind, vector, steps, samples, meta, base_version)

    async def pull(self, meta: dict[str, Any] | None = None, base_version: int | None = None
                   ) -> tuple[torch.Tensor, int, dict[str, Any]]:
        gc.collect()
        self.alive_at_pull.append(sum(ref() is not None for ref in self.watched))
        pulled = await super().pull(meta, base_version)
        self.watched.append(weakref.ref(pulled[0]))
        return pulled


def fedasync() -> tuple[ServerRule[Any], WorkerLoop[Any], FakeStore]:
    store = FakeStore(torch.ones(4), workers=1)
    params = FedAsyncParams(local_steps=STEPS)
    return FedAsyncServer(params, store), FedAsyncWorker(params), store


def easgd_async() -> tuple[ServerRule[Any], WorkerLoop[Any], FakeStore]:
    store = FakeStore(torch.ones(4), workers=1)
    params = EasgdParams(local_steps=STEPS)
    return EasgdAsyncServer(params, store), EasgdAsyncWorker(params), store


@pytest.mark.parametrize("make", [fedasync, easgd_async], ids=["fedasync", "easgd_async"])
async def test_a_worker_waiting_on_its_pull_holds_no_earlier_vector(make: Any) -> None:
    rule, loop, store = make()
    ctx = WatchedContext(store, rule, max_steps=ROUNDS * STEPS)
    with pytest.raises(RunStopped):
        await loop.run(ctx)
    # one pull a round, and one more before the steps that stop the run (fedasync pulls
    # first); none of them finds a vector of an earlier round alive
    assert len(ctx.alive_at_pull) >= ROUNDS
    assert ctx.alive_at_pull == [0] * len(ctx.alive_at_pull)
