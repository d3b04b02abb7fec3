"""Mutation testing of the round protocols found one SCAFFOLD rule no test held: without a
round policy that drops late reports, a control variate based on an older version is out
of step (refused, as a delta would be), not taken as a late ``c_i+``; with one, it is
kept as the worker's latest ``c_i`` (tests/test_s9_proto_scaffold.py). Expected means
are computed here from the pushed values."""

from __future__ import annotations

import pytest
import torch

from asyncsync.engine.store import ParameterStore
from asyncsync.protocols.base import FlatSGD, OutOfStep, Push
from asyncsync.protocols.scaffold import ScaffoldParams, ScaffoldServer


def _push(worker: int, version: int, kind: str, value: float) -> Push:
    return Push(worker, version, kind, torch.full((3,), value), 8, 128)


async def test_a_stale_control_variate_is_refused_without_a_round_policy() -> None:
    store = ParameterStore(torch.zeros(3), 2, FlatSGD(0.1))
    store.live.update(range(2))
    rule = ScaffoldServer(ScaffoldParams(), store)
    for worker, value in [(0, 2.0), (1, 4.0)]:
        await rule.on_push(_push(worker, 0, "control", value))
    for worker in (0, 1):
        await rule.on_push(_push(worker, 0, "delta", 1.0))
    assert store.version == 1
    with pytest.raises(OutOfStep, match="based on version 0"):
        await rule.on_push(_push(1, 0, "control", 100.0))
    assert rule.latest.keys() == {0, 1}
    assert torch.equal(rule.latest[1], torch.full((3,), 4.0))  # untouched by the refusal
    assert torch.allclose(rule.control, torch.full((3,), (2.0 + 4.0) / 2))
