"""Defining properties of bsp and asp, run in process with scripted slowdowns."""

from __future__ import annotations

import itertools
import statistics
from typing import Any

import pytest

from asyncsync.protocols.asp import AspServer
from asyncsync.protocols.base import Push
from tests.helpers import run_http, run_local


async def test_bsp_every_version_has_exactly_n_gradients_from_that_version() -> None:
    core, finals = await run_local("bsp", [0.0, 0.005, 0.02], max_steps=20)
    commits = core.store.commits
    assert len(commits) >= 19
    for commit in commits:
        ranks = sorted(worker for worker, _ in commit.contributions)
        assert ranks == [0, 1, 2], commit
        assert all(base == commit.version - 1 for _, base in commit.contributions), commit
    assert core.store.staleness.maximum == 0
    # the barrier held the fast workers: they waited while the slow one computed
    assert core.store.held_s[0] > core.store.held_s.get(2, 0.0)
    assert {f["steps"] for f in finals} <= {20, 21}


async def test_asp_never_waits_for_a_10x_slower_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    pushes: list[int] = []  # the worker of every push the server took, in order
    on_push = AspServer.on_push

    async def counting(self: AspServer, push: Push) -> dict[str, Any]:
        reply = await on_push(self, push)
        pushes.append(push.worker)
        return reply

    monkeypatch.setattr(AspServer, "on_push", counting)
    core, finals = await run_local("asp", [0.005, 0.05], max_steps=80)
    fast, slow = finals
    assert fast["steps"] == 80
    assert slow["steps"] >= 1
    # were the fast worker held for the slow one, both would make the same progress
    assert fast["steps"] >= 4 * slow["steps"], (fast["steps"], slow["steps"])
    # every push became one version of its own, applied on arrival
    assert core.store.version == len(pushes) == len(core.store.commits)
    assert [c.contributions[0][0] for c in core.store.commits] == pushes
    assert all(len(c.contributions) == 1 for c in core.store.commits)
    assert pushes.count(0) >= 4 * pushes.count(1) >= 4
    # the fast worker kept committing while each slow step ran
    slow_at = [i for i, worker in enumerate(pushes) if worker == 1]
    between = [b - a - 1 for a, b in itertools.pairwise(slow_at)]
    assert not between or statistics.median(between) >= 3, between
    # and the slow worker's gradients were applied stale
    assert core.store.staleness.count == core.store.version
    assert core.store.staleness.maximum >= 2


async def test_bsp_and_asp_over_http() -> None:
    for protocol in ("bsp", "asp"):
        core, finals = await run_http(protocol, workers=3, time_s=1.0)
        assert core.store.version > 5, protocol
        assert all(f["steps"] > 5 and f["bytes_up"] > 0 for f in finals), protocol
        assert core.evals and core.evals[-1].accuracy > 0.5, protocol
