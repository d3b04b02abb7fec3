"""Overlap is real: behind a slow link, wbsp_opt keeps computing; bsp cannot (nbsync's
overlap is checked, on the same link and delays, in test_protocol_nbsync.py)."""

from __future__ import annotations

from tests.helpers import SLOW_LINK, SLOW_LINK_DELAYS, run_local


async def _proportions(protocol: str, time_s: float) -> list[float]:
    _, finals = await run_local(protocol, SLOW_LINK_DELAYS, time_s=time_s, link=SLOW_LINK)
    assert all(f["steps"] >= 1 for f in finals), (protocol, finals)
    return [f["compute_s"] / f["wall_s"] for f in finals]


async def test_overlapping_protocols_compute_while_bsp_waits_for_the_link() -> None:
    bsp = await _proportions("bsp", 2.5)
    wbsp_opt = await _proportions("wbsp_opt", 3.5)
    assert max(bsp) < 0.6, bsp
    assert min(wbsp_opt[:2]) > 0.9, wbsp_opt  # the fast workers
