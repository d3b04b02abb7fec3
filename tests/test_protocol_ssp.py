"""SSP: the clock gap between workers never exceeds the staleness bound s."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from asyncsync.engine.store import Commit
from asyncsync.protocols.ssp import SspParams
from asyncsync.schema import ConfigError, from_mapping
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
