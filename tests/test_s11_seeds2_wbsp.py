"""WBSP with two equally slow workers and no `slow_worker`: one version per slow step.

PROTOCOLS.md: a new version becomes pullable when *the* slowest worker pushes a new step.
Worker 0 steps every 1 s, workers 1 and 2 every 2 s (the paper's H2 scenario: the odd
ranks of four sleep alike). If both tied workers published, the version would advance
twice per slow step, and the second version would hold one slow worker's delta alone.
One of them is the slowest and stays so: its pushes publish, the other's steps join the
next version.
"""

from __future__ import annotations

import torch

from asyncsync.protocols.base import Push
from asyncsync.protocols.testing import FakeStore
from asyncsync.protocols.wbsp import WbspParams, WbspServer

SCHEDULE = [(0.0, (0, 1, 2)), (1.0, (0,)), (2.0, (0, 1, 2)), (3.0, (0,)), (4.0, (0, 1, 2)),
            (5.0, (0,)), (6.0, (0, 1, 2))]
"""(time, workers pushing one step then, in that order)."""


async def test_equally_slow_workers_publish_one_version_per_slow_step() -> None:
    store = FakeStore(torch.zeros(2), 3)
    rule = WbspServer(WbspParams(), store)
    published: dict[float, list[int]] = {}
    for at, workers in SCHEDULE:
        store.clock = at
        for worker in workers:
            await rule.on_push(Push(worker, store.version, "delta", torch.ones(2), 1, 16))
            if rule.pushes[-1].published:
                published.setdefault(at, []).append(worker)
    # from t = 4 on every estimate is known (0: 1 s per step, 1 and 2: 2 s): one version
    # per slow step, made by one of the two slow workers
    later = {at: ranks for at, ranks in published.items() if at >= 4}
    assert later in ({4.0: [1], 6.0: [1]}, {4.0: [2], 6.0: [2]})
    # every version after the first pair holds a step of each worker
    for commit in store.commits[-2:]:
        assert {worker for worker, _ in commit.contributions} == {0, 1, 2}


async def test_nearly_equal_slow_workers_still_publish_one_version_per_slow_step() -> None:
    """Workers 1 and 2 both step every 2 s give or take 2.5 %, so their estimates (newest
    gap only: smoothing 1) cross back and forth; the slowest must not flip with them."""
    times = {0: [float(t) for t in range(11)],
             1: [0.0, 2.0, 4.05, 6.0, 8.05, 10.0],
             2: [0.0, 2.05, 4.0, 6.05, 8.0, 10.05]}
    events = sorted((at, worker) for worker, ats in times.items() for at in ats)
    store = FakeStore(torch.zeros(2), 3)
    rule = WbspServer(WbspParams(rate_smoothing=1.0), store)
    published = []
    for at, worker in events:
        store.clock = at
        await rule.on_push(Push(worker, store.version, "delta", torch.ones(2), 1, 16))
        if rule.pushes[-1].published:
            published.append((at, worker))
    later = [(at, worker) for at, worker in published if at >= 4]
    # one publish in each slow period from t = 4 on, all by the same slow worker
    assert [int(at // 2) for at, _ in later] == [2, 3, 4, 5]
    assert len({worker for _, worker in later}) == 1 and later[0][1] != 0
