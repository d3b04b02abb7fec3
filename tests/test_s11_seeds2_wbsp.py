"""WBSP with two equally slow workers and no `slow_worker`: one version per slow step.

PROTOCOLS.md: a new version becomes pullable when *the* slowest worker pushes a new step.
Worker 0 steps every 1 s, workers 1 and 2 every 2 s (the paper's H2 scenario: the odd
ranks of four sleep alike). If both tied workers published, the version would advance
twice per slow step, and the second version would hold one slow worker's delta alone.
Ties go to the lowest rank: worker 1 publishes, worker 2's step joins the next version.
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
    # per slow step, made by the lower-ranked of the two slow workers
    assert {at: ranks for at, ranks in published.items() if at >= 4} == {4.0: [1], 6.0: [1]}
    # every version after the first pair holds a step of each worker
    for commit in store.commits[-2:]:
        assert {worker for worker, _ in commit.contributions} == {0, 1, 2}
