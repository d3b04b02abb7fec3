"""ESync in virtual time: the state oracle's local-step counts and barrier waits, exactly.

With step times c_i and the slowest worker's c_s, every round after the first starts with
all workers together; worker i keeps stepping while another step fits with its slack,
i.e. it stops after the first k >= 1 steps with ``(1 + eps) c_i > c_s - k c_i``, then waits
``c_s - k c_i`` for the slowest (which stops after its one step). The numbers below come
from that closed form, not from the oracle.
"""

from __future__ import annotations

import pytest
import torch

from asyncsync.protocols.base import Push
from asyncsync.protocols.esync import EsyncParams, EsyncServer
from asyncsync.protocols.testing import FakeStore
from tests.helpers import STEP_S, run_local

STEP_MS = [1, 3, 10]
"""Each worker's step in milliseconds: STEP_S plus a per-worker delay."""


def closed_form(step_ms: int, slowest_ms: int, eps: float) -> tuple[int, int]:
    """Local steps per round and the wait at the barrier (ms) of a worker."""
    if step_ms == slowest_ms:
        return 1, 0
    k = 1
    while (1 + eps) * step_ms <= slowest_ms - k * step_ms:
        k += 1
    return k, slowest_ms - k * step_ms


@pytest.mark.parametrize("eps", [0.5, 0.25])
async def test_fast_workers_fill_the_slowest_step_and_arrive_together(eps: float) -> None:
    delays = [ms / 1000 - STEP_S for ms in STEP_MS]
    core, finals = await run_local("esync", delays, params=EsyncParams(eps=eps), time_s=0.3)
    rule = core.rule
    assert isinstance(rule, EsyncServer)
    rounds = list(rule.history)[1:]  # the first round includes the start-up
    assert len(rounds) >= 20
    expected = [closed_form(ms, max(STEP_MS), eps) for ms in STEP_MS]
    # eps 0.5: [(9, 1), (2, 4), (1, 0)]; eps 0.25: [(9, 1), (3, 1), (1, 0)]
    for record in rounds:
        assert [record.steps[w] for w in range(3)] == [k for k, _ in expected], record
        for worker, (_, wait_ms) in enumerate(expected):
            assert record.held_s[worker] == pytest.approx(wait_ms / 1000, abs=1e-6), record
            # the oracle's guarantee: nobody waits a whole slack-widened step of its own
            assert record.held_s[worker] < (1 + eps) * STEP_MS[worker] / 1000
    # every version is one round that averaged the three workers' deltas of that version
    for commit in core.store.commits:
        assert sorted(w for w, _ in commit.contributions) == [0, 1, 2]
    assert all(f["steps"] > 0 for f in finals)


async def test_nobody_is_ready_before_the_slowest_has_started_its_step() -> None:
    """After a round closes, the slowest (10 s steps) starts only at 19.25 (its model came
    late: a slow link). Time left until it finishes is 19.25 + 10 - t, so worker 0 (1 s
    steps, slack 0.5 s) is ready from t = 28 on, the first t with 1.5 > 29.25 - t. The
    oracle counted the slowest's step from the round's close (10), made worker 0 ready at
    t = 19, and it then waited 10 s at the barrier."""
    store = FakeStore(torch.zeros(4), 2)
    rule = EsyncServer(EsyncParams(eps=0.5), store)

    async def query(worker: int, at: float, k: int, step_s: float) -> bool:
        store.clock = at
        meta: dict[str, float] = {"k": k, "c": step_s} if k else {"k": 0}
        return bool((await rule.on_query(worker, meta))["sync"])

    assert not await query(0, 0.0, 0, 1.0) and not await query(1, 0.0, 0, 10.0)
    assert not await query(0, 1.0, 1, 1.0)  # the slowest's step time is not known yet
    assert await query(1, 10.0, 1, 10.0)  # the slowest: ready when its step ends
    assert await query(0, 10.0, 10, 1.0)  # the slowest is at the barrier
    for worker in range(2):
        await rule.on_push(Push(worker, 0, "delta", torch.ones(4), 1, 16))
    assert store.version == 1
    assert not await query(0, 10.0, 0, 1.0)
    ready_at = []
    for t in range(11, 31):
        if t == 20:
            assert not await query(1, 19.25, 0, 10.0)
        if await query(0, float(t), t - 10, 1.0):
            ready_at.append(t)
    assert ready_at[0] == 28, ready_at
