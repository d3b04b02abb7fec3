"""A worker's time shares: exclusive, so they never add up to more than the wall time."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from asyncsync.runlog.metrics import IntervalUnion, JsonlLog, RankLog, WorkerMetrics
from asyncsync.runlog.schema import RANK


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
    assert s.held_s == pytest.approx(2.0)
    assert s.compute_s + s.comm_s + s.held_s == pytest.approx(3.0)


def test_a_long_run_keeps_few_pieces_and_its_measure() -> None:
    union = IntervalUnion()
    for k in range(10_000):
        union.add(k, k + 0.5)
        union.add(k + 0.25, k + 0.75)  # overlaps the previous piece
    assert len(union.pieces) <= IntervalUnion.KEEP
    assert union.measure() == pytest.approx(10_000 * 0.75)


def exact_union(intervals: list[tuple[float, float]]) -> float:
    """The measure of a union of intervals, by sorting and sweeping."""
    total, reach = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def test_the_union_of_overlapping_and_out_of_order_intervals_is_exact() -> None:
    """Random intervals, added in roughly increasing time with overlaps that reach back
    over several kept pieces, some spanning many of them."""
    rng = random.Random(7)
    union = IntervalUnion()
    intervals = []
    for k in range(50):
        start = k + rng.uniform(-3.0, 1.0)
        interval = (start, start + rng.choice([0.1, 0.4, 2.5, 6.0]))
        intervals.append(interval)
        union.add(*interval)
        assert union.measure() == pytest.approx(exact_union(intervals))
    assert all(b < c for (_, b), (c, _) in zip(union.pieces, union.pieces[1:], strict=False))


def test_a_rank_log_writes_the_rank_first_then_the_record_as_json_would(
        tmp_path: Path) -> None:
    """The shared log's lines are ``json.dumps({RANK: rank, **record})`` (compact), whether
    the rank's field is spliced in front of the encoded record or the record carries one."""
    records = [{"event": "compute", "t": 0.1, "loss": 2.30258, "name": "é\n\"x\""},
               {"event": "final", "steps": 3, RANK: 99}, {}]
    shared = JsonlLog(tmp_path / "workers.jsonl")
    log = RankLog(shared, 7)
    for record in records:
        log.write(record)
    shared.close()
    expected = [json.dumps({RANK: 7, **record}, separators=(",", ":")) for record in records]
    assert (tmp_path / "workers.jsonl").read_text().splitlines() == expected


def test_a_missing_or_diverged_loss_is_written_as_json_null(tmp_path: Path) -> None:
    """A worker that never stepped wrote ``"loss": NaN``, which strict JSON refuses."""
    def strict(line: str) -> dict[str, object]:
        def refuse(constant: str) -> None:
            raise ValueError(f"not JSON: {constant}")
        parsed: dict[str, object] = json.loads(line, parse_constant=refuse)
        return parsed

    idle = WorkerMetrics(JsonlLog(tmp_path / "idle.jsonl"))
    idle.start()
    assert idle.final()["loss"] is None
    idle.log.close()
    assert [strict(line)["loss"] for line in (tmp_path / "idle.jsonl").read_text().splitlines()
            ] == [None]
    diverged = WorkerMetrics(JsonlLog(tmp_path / "nan.jsonl"))
    diverged.start()
    diverged.computed(0.0, 1, 8, 0.1, float("nan"), 1.0, 0)
    diverged.computed(0.1, 1, 8, 0.1, 0.123456, 1.0, 0)
    diverged.final()
    diverged.log.close()
    lines = (tmp_path / "nan.jsonl").read_text().splitlines()
    assert [strict(line)["loss"] for line in lines] == [None, 0.12346, 0.123456]
