"""WBSP: versions advance only on the slowest worker's pushes; fast workers stay busy."""

from __future__ import annotations

import pytest

from asyncsync.protocols.wbsp import WbspParams, WbspServer
from tests.helpers import run_http, run_local


def _rule(core: object) -> WbspServer:
    rule = getattr(core, "rule", None)
    assert isinstance(rule, WbspServer)
    return rule


async def test_versions_advance_only_on_the_fixed_slow_workers_pushes() -> None:
    core, finals = await run_local("wbsp", [0.005, 0.01, 0.04],
                                   params=WbspParams(slow_worker=2), time_s=2.0)
    rule = _rule(core)
    # among the recent pushes (the rule keeps a bounded window), exactly worker 2's publish
    assert any(p.worker != 2 for p in rule.pushes)
    assert all(p.published == (p.worker == 2) for p in rule.pushes)
    assert core.store.version >= 15
    # each version carries several fast deltas, ending with the slowest worker's step
    for commit in core.store.commits:
        assert commit.contributions[-1][0] == 2
    # fast workers keep training: several local steps per version
    assert finals[0]["steps"] >= 3 * core.store.version
    assert finals[1]["steps"] >= 1.5 * core.store.version
    # and pull each new version at once: their deltas are at most a version or two old
    assert core.store.staleness.maximum <= 2
    assert sum(core.store.held_s.values()) == 0.0


async def test_slowest_worker_is_detected_from_step_rates() -> None:
    core, finals = await run_local("wbsp", [0.04, 0.005, 0.01], time_s=2.0)
    published = [p.worker for p in _rule(core).pushes if p.published]
    later = published[3:]  # until every worker has pushed twice, rates are unknown
    assert len(later) >= 10
    assert later.count(0) >= 0.9 * len(later), published
    assert finals[1]["steps"] >= 3 * core.store.version


def test_bad_params_name_the_parameter() -> None:
    with pytest.raises(ValueError, match="slow_worker"):
        WbspParams(slow_worker=-1)
    for smoothing in (0.0, 1.5):
        with pytest.raises(ValueError, match="rate_smoothing"):
            WbspParams(rate_smoothing=smoothing)


async def test_slow_worker_must_be_a_rank_of_the_run() -> None:
    with pytest.raises(ValueError, match="slow_worker"):
        await run_local("wbsp", [0.0, 0.0], params=WbspParams(slow_worker=2), time_s=0.2)


async def test_wbsp_over_http() -> None:
    core, finals = await run_http("wbsp", workers=3, time_s=1.0)
    assert core.store.version > 3
    assert all(f["steps"] > 5 and f["bytes_up"] > 0 for f in finals)
    assert core.evals and core.evals[-1].accuracy > 0.5
