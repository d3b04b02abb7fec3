"""Overlap Local SGD with alpha = 1 could never train: every local model is reset to the
anchor and pushed as it is, so the anchor's average never moves (a 3 s virtual run
stayed at its initial accuracy). The option is refused there, naming the key."""

from __future__ import annotations

import pytest
import torch

from asyncsync.protocols.base import RunStopped
from asyncsync.protocols.overlap_local_sgd import (
    OverlapLocalSgdParams,
    OverlapLocalSgdServer,
    OverlapLocalSgdWorker,
)
from asyncsync.protocols.testing import FakeContext, FakeStore


def test_alpha_one_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^alpha: must be in \(0, 1\)"):
        OverlapLocalSgdParams(alpha=1.0)


async def test_a_large_alpha_still_moves_the_anchor() -> None:
    """Just below 1 the protocol still trains: the averaged model leaves its start."""
    params = OverlapLocalSgdParams(local_steps=2, alpha=0.99)
    store = FakeStore(torch.full((4,), 8.0), workers=1)
    rule = OverlapLocalSgdServer(params, store)
    ctx = FakeContext(store, rule, max_steps=20, lr=0.5)
    with pytest.raises(RunStopped):  # after the 20th step
        await OverlapLocalSgdWorker(params).run(ctx)
    assert store.version >= 5
    assert float(store.w.norm()) < float(torch.full((4,), 8.0).norm())
