"""DC-ASGD with ring = 1 kept only the current version's pulled model, so no stale
gradient could ever be compensated and lambda was silently ignored (a virtual run equalled
asp exactly). The ring must reach back at least one version; ring = 2 compensates a
gradient of staleness 1."""

from __future__ import annotations

import pytest
import torch

from asyncsync.engine.store import ParameterStore
from asyncsync.protocols.base import FlatSGD, Pull, Push
from asyncsync.protocols.dcasgd import DcasgdParams, DcasgdServer


def test_a_ring_of_one_version_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^ring: must be >= 2"):
        DcasgdParams(ring=1)


async def test_a_ring_of_two_compensates_staleness_one() -> None:
    store = ParameterStore(torch.ones(4, dtype=torch.float64), 2, FlatSGD(0.1))
    rule = DcasgdServer(DcasgdParams(lam=1.0, ring=2), store)
    await rule.on_pull(Pull(0, 0))
    await rule.on_pull(Pull(1, 0))
    g = torch.full((4,), 2.0, dtype=torch.float64)
    await rule.on_push(Push(0, 0, "gradient", g.clone(), 1, 16))  # w: 1 - 0.2 = 0.8
    meta = await rule.on_push(Push(1, 0, "gradient", g.clone(), 1, 16))
    assert meta["compensated"] is True
    # g + lam g g (w - w_pulled) = 2 + 4 * (0.8 - 1) = 1.2; w = 0.8 - 0.1 * 1.2
    assert torch.allclose(store.w, torch.full((4,), 0.68, dtype=torch.float64))
