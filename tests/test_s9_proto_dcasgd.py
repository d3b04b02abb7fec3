"""DC-ASGD says when its ring is too short for the run: a gradient whose pulled model has
left the ring is applied uncompensated (plain ASP), and the server logs a warning naming
``ring`` at the 1st, 10th, 100th, ... such gradient instead of degrading silently."""

from __future__ import annotations

import logging

import pytest
import torch

from asyncsync.engine.store import ParameterStore
from asyncsync.protocols.base import FlatSGD, Pull, Push
from asyncsync.protocols.dcasgd import DcasgdParams, DcasgdServer


async def test_uncompensated_gradients_are_reported_naming_ring(
        caplog: pytest.LogCaptureFixture) -> None:
    store = ParameterStore(torch.ones(4, dtype=torch.float64), 2, FlatSGD(0.1))
    rule = DcasgdServer(DcasgdParams(lam=1.0, ring=2), store)
    g = torch.full((4,), 0.5, dtype=torch.float64)
    await rule.on_pull(Pull(1, 0))
    for version in range(12):  # worker 0 moves the model on; 1 stays at version 0
        await rule.on_pull(Pull(0, version))
        await rule.on_push(Push(0, version, "gradient", g.clone(), 1, 16))
    with caplog.at_level(logging.WARNING, logger="asyncsync.protocols.dcasgd"):
        for _ in range(10):  # staleness 12 >= ring 2: uncompensated
            meta = await rule.on_push(Push(1, 0, "gradient", g.clone(), 1, 16))
            assert meta["compensated"] is False
    assert rule.uncompensated == 10
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2  # the 1st and the 10th
    assert "1 gradients uncompensated (the latest of staleness 12)" in warnings[0]
    assert "last 2 versions; raise ring" in warnings[0]
    assert "10 gradients uncompensated" in warnings[1]
