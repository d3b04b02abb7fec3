"""WBSP-opt: pushes overlap local steps; fast workers compute > 90% of the time."""

from __future__ import annotations

import statistics

import pytest

from asyncsync.hetero.network import LinkSpec
from asyncsync.protocols import get_protocol
from asyncsync.protocols.wbsp import WbspParams, WbspServer
from tests.helpers import run_http, run_local

# pulling the model (~0.8 kB with its header) takes ~0.55 s, over three 0.15 s steps;
# pushing a delta (~1 kB with the request header) ~0.17 s
SLOW_LINK = LinkSpec(uplink_mbps=0.05, downlink_mbps=0.012, latency_ms=5)


def test_reuses_the_wbsp_server_rule() -> None:
    protocol = get_protocol("wbsp_opt")
    assert protocol.server is WbspServer
    assert protocol.params is WbspParams


async def test_fast_workers_stay_busy_behind_a_slow_link() -> None:
    core, finals = await run_local("wbsp_opt", [0.15, 0.15, 0.4], time_s=4.5,
                                   link=SLOW_LINK)
    rule = core.rule
    assert isinstance(rule, WbspServer)
    proportions = [f["compute_s"] / f["wall_s"] for f in finals]
    assert min(proportions[:2]) > 0.9, proportions
    # versions advance on the slowest worker's pushes (once every rate is known)
    published = [p.worker for p in rule.pushes if p.published]
    assert len(published) >= 5
    assert all(worker == 2 for worker in published[3:]), published
    # a push carries the steps made while the previous one was in flight: several
    for worker in (0, 1):
        steps = [p.steps for p in rule.pushes if p.worker == worker]
        assert statistics.mean(steps[1:]) >= 2.5, (worker, steps)
        assert finals[worker]["steps"] >= 3 * core.store.version
    assert sum(p.steps for p in rule.pushes) <= sum(f["steps"] for f in finals)


async def test_fixed_slow_worker() -> None:
    core, _ = await run_local("wbsp_opt", [0.0, 0.005, 0.02],
                              params=WbspParams(slow_worker=2), time_s=1.0)
    rule = core.rule
    assert isinstance(rule, WbspServer)
    assert core.store.version >= 10
    # in the rule's window of recent pushes, exactly worker 2's publish a version
    assert any(p.worker != 2 for p in rule.pushes)
    assert all(p.published == (p.worker == 2) for p in rule.pushes)


async def test_wbsp_opt_over_http() -> None:
    core, finals = await run_http("wbsp_opt", workers=3, time_s=1.0)
    assert core.store.version > 3
    assert all(f["steps"] > 5 and f["bytes_up"] > 0 for f in finals)
    assert core.evals and core.evals[-1].accuracy > 0.5


def test_bad_params_name_the_parameter() -> None:
    with pytest.raises(ValueError, match="slow_worker"):
        WbspParams(slow_worker=-2)
