"""SSP: the clock gap between workers never exceeds the staleness bound s."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator

import pytest
import torch

from asyncsync.engine.store import Commit, ParameterStore
from asyncsync.protocols.messages import OutOfStep, Push
from asyncsync.protocols.ports import LiveSet
from asyncsync.protocols.ssp import SspParams, SspServer
from asyncsync.schema import ConfigError, from_mapping
from asyncsync.training.optim import FlatSGD
from tests.helpers import run_http, run_local


def clock_gaps(commits: Iterable[Commit], workers: int) -> list[int]:
    """For each applied gradient, its worker's clock minus the slowest clock at that moment.

    Clocks are rebuilt from the commit log alone (one gradient per commit), so this checks
    the rule from the outside: a worker allowed to start iteration c (c - min <= s) can
    only meet a minimum that has grown since, when its gradient lands.
    """
    clocks = [0] * workers
    gaps = []
    for commit in commits:
        ((worker, _),) = commit.contributions
        gaps.append(clocks[worker] - min(clocks))
        clocks[worker] += 1
    return gaps


@pytest.mark.parametrize("bound", [0, 2])
async def test_clock_gap_never_exceeds_s(bound: int) -> None:
    core, finals = await run_local("ssp", [0.0, 0.01, 0.04], params=SspParams(bound),
                                   max_steps=25)
    gaps = clock_gaps(core.store.commits, 3)
    assert len(gaps) >= 40
    assert max(gaps) <= bound
    # the bound was reached and held the fast worker back while the slow one computed
    assert max(gaps) == bound
    assert core.store.held_s[0] > 0.2
    fast, _, slow = finals
    assert fast["steps"] - slow["steps"] <= bound + 1


async def test_large_s_behaves_like_asp() -> None:
    core, finals = await run_local("ssp", [0.002, 0.03], params=SspParams(1000), max_steps=60)
    gaps = clock_gaps(core.store.commits, 2)
    # nobody waited, and the fast worker ran far ahead (the gap check above can fail)
    assert sum(core.store.held_s.values()) == 0.0
    assert max(gaps) >= 10
    assert core.store.staleness.maximum >= 2
    assert finals[0]["steps"] >= 2 * finals[1]["steps"]


def test_bad_staleness_names_the_parameter() -> None:
    with pytest.raises(ValueError, match=r"^staleness:"):
        SspParams(staleness=-1)
    with pytest.raises(ConfigError, match=r"^protocol\.staleness:"):
        from_mapping(SspParams, {"staleness": -2}, "protocol")


async def test_ssp_over_http() -> None:
    core, finals = await run_http("ssp", workers=3, params=SspParams(2), time_s=1.0)
    assert core.store.version > 5
    assert max(clock_gaps(core.store.commits, 3)) <= 2
    assert all(f["steps"] > 5 and f["bytes_up"] > 0 for f in finals)
    assert core.evals and core.evals[-1].accuracy > 0.5


class CountingLive(LiveSet):
    """A live set that counts how often it is walked."""

    walks = 0

    def __iter__(self) -> Iterator[int]:
        CountingLive.walks += 1
        return super().__iter__()


async def test_the_slowest_clock_follows_pushes_leaves_and_joins() -> None:
    """Random pushes (some by a worker just dropped), leaves and rejoins of 12 workers
    under s = 2: after each, every worker's gap is its clock minus the smallest live
    clock, both kept by this test."""
    workers, bound = 12, 2
    store = ParameterStore(torch.zeros(4), workers, FlatSGD(1.0))
    store.live.update(range(workers))
    rule = SspServer(SspParams(bound), store)
    clocks, live = [0] * workers, set(range(workers))
    draw = random.Random(5)
    refusals = 0
    for _ in range(3000):
        worker, action = draw.randrange(workers), draw.random()
        if worker not in live and action < 0.5:  # a push under way when it was dropped
            if clocks[worker] - min(clocks[j] for j in live) <= bound:
                await rule.on_push(Push(worker, store.version, "gradient", torch.zeros(4), 1, 16))
                clocks[worker] += 1
        elif worker not in live:
            store.live.add(worker)  # as the engine readmits it, then the rule's hook;
            rule.gap(worker)  # a held pull may check its gap before the hook runs
            await rule.on_join(worker)
            live.add(worker)
            clocks[worker] = min(clocks[j] for j in live if j != worker)
        elif action < 0.02 and len(live) > 1:
            store.live.discard(worker)
            await rule.on_leave(worker)
            live.discard(worker)
        else:
            push = Push(worker, store.version, "gradient", torch.zeros(4), 1, 16)
            if clocks[worker] - min(clocks[j] for j in live) > bound:
                with pytest.raises(OutOfStep):
                    await rule.on_push(push)
                refusals += 1
            else:
                await rule.on_push(push)
                clocks[worker] += 1
        slowest = min(clocks[j] for j in live)
        assert [rule.gap(j) for j in range(workers)] == [c - slowest for c in clocks]
    assert refusals > 100 and store.version > 1000


async def test_a_push_does_not_walk_the_live_workers() -> None:
    """2,000 workers push one round each: the live set is walked once, to count them, not
    once per push or per check (it was: O(workers) per push)."""
    workers = 2000
    store = ParameterStore(torch.zeros(4), workers, FlatSGD(1.0))
    store.live = CountingLive(range(workers))
    rule = SspServer(SspParams(1), store)
    CountingLive.walks = 0
    for worker in range(workers):
        await rule.on_push(Push(worker, store.version, "gradient", torch.zeros(4), 1, 16))
        assert rule.gap(worker) == (1 if worker < workers - 1 else 0)  # the last catches up
    assert rule.slowest() == 1 and CountingLive.walks == 1
    store.live.discard(0)  # the live set changed: counted again, once
    assert rule.slowest() == 1 and rule.gap(1) == 0 and CountingLive.walks == 2


def test_the_live_set_counts_every_change() -> None:
    live = LiveSet([1, 2])
    live.add(3)
    live.discard(3)
    live.remove(2)
    live.update([4, 5])
    live.difference_update([5])
    live.intersection_update([1, 4])
    live.symmetric_difference_update([6])
    assert live == {1, 4, 6} and live.changes == 7
    live |= {7}
    live -= {7}
    live &= {1, 4}
    live ^= {3}
    live.pop()
    live.clear()
    assert not live and live.changes == 13
