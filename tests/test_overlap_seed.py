"""Overlap is real: behind a slow link, nbsync and wbsp_opt keep computing; bsp cannot."""

from __future__ import annotations

from asyncsync.hetero.network import LinkSpec
from tests.helpers import run_local

# pulling the model (~0.8 kB with its header) takes ~0.55 s, over three 0.15 s steps;
# pushing a delta (~1 kB with the request header) ~0.17 s
SLOW_LINK = LinkSpec(uplink_mbps=0.05, downlink_mbps=0.012, latency_ms=5)
DELAYS = [0.15, 0.15, 0.4]


async def _proportions(protocol: str, time_s: float) -> list[float]:
    _, finals = await run_local(protocol, DELAYS, time_s=time_s, link=SLOW_LINK)
    assert all(f["steps"] >= 1 for f in finals), (protocol, finals)
    return [f["compute_s"] / f["wall_s"] for f in finals]


async def test_overlapping_protocols_compute_while_bsp_waits_for_the_link() -> None:
    bsp = await _proportions("bsp", 2.5)
    nbsync = await _proportions("nbsync", 3.5)
    wbsp_opt = await _proportions("wbsp_opt", 3.5)
    assert max(bsp) < 0.6, bsp
    assert min(nbsync) > 0.9, nbsync
    assert min(wbsp_opt[:2]) > 0.9, wbsp_opt  # the fast workers
