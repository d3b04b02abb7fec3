"""A worker's time shares: exclusive, so they never add up to more than the wall time."""

from __future__ import annotations

import pytest

from asyncsync.metrics import IntervalUnion, JsonlLog, WorkerMetrics


def test_overlapping_requests_count_their_waiting_once() -> None:
    """A push over [0, 2] held 1.5 s, a pull over [0, 3] held 2.8 s, a step over
    [0.5, 1.0]: computing 0.5 s, moving bytes 0.5 s ([0, 0.5] less nothing, as the step
    starts at 0.5), waiting 2 s ([1, 3]); summing the held times gave 4.3 s of waiting."""
    metrics = WorkerMetrics(JsonlLog(None))
    metrics.transferred("push", 0.0, 2.0, 1.5, 0, 0, None)
    metrics.transferred("pull", 0.0, 3.0, 2.8, 0, 0, 1)
    metrics.computed(0.5, 1, 8, 0.5, 0.1, 1.0, 0)
    s = metrics.stats
    assert s.compute_s == pytest.approx(0.5)
    assert s.comm_s == pytest.approx(0.5)
    assert s.wait_s == pytest.approx(2.0)
    assert s.compute_s + s.comm_s + s.wait_s == pytest.approx(3.0)


def test_a_long_run_keeps_few_pieces_and_its_measure() -> None:
    union = IntervalUnion()
    for k in range(10_000):
        union.add(k, k + 0.5)
        union.add(k + 0.25, k + 0.75)  # overlaps the previous piece
    assert len(union.pieces) <= IntervalUnion.KEEP
    assert union.measure() == pytest.approx(10_000 * 0.75)
