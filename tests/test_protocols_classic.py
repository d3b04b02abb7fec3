"""Defining properties of bsp and asp, run in process with scripted slowdowns."""

from __future__ import annotations

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
    assert core.store.blocked_s[0] > core.store.blocked_s.get(2, 0.0)
    assert {f["steps"] for f in finals} <= {20, 21}


async def test_asp_never_waits_and_records_staleness() -> None:
    core, finals = await run_local("asp", [0.0, 0.03], max_steps=60)
    # no request was ever held for another worker
    assert sum(core.store.blocked_s.values()) == 0.0
    fast, slow = finals
    assert fast["steps"] >= 3 * slow["steps"]
    # every commit applied exactly one gradient, and the slow worker's were stale
    assert all(len(c.contributions) == 1 for c in core.store.commits)
    assert core.store.staleness.count == len(core.store.commits)
    assert core.store.staleness.maximum >= 2


async def test_bsp_and_asp_over_http() -> None:
    for protocol in ("bsp", "asp"):
        core, finals = await run_http(protocol, workers=3, time_s=1.0)
        assert core.store.version > 5, protocol
        assert all(f["steps"] > 5 and f["bytes_up"] > 0 for f in finals), protocol
        assert core.evals and core.evals[-1].accuracy > 0.5, protocol
