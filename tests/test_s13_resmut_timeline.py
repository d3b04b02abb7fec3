"""The timeline's window, spans and rows, against hand-computed values (mutation testing:
each test here failed against a plausible slip in `asyncsync.results.timeline`)."""

from __future__ import annotations

from typing import Any

import pytest

from asyncsync.results import timeline
from asyncsync.runlog.schema import HELD, KEY, Kind


def final(wall_s: float, steps: int, compute_s: float = 1.0) -> dict[str, Any]:
    return {KEY: Kind.FINAL, "wall_s": wall_s, "steps": steps, "compute_s": compute_s}


def test_the_window_starts_at_a_fifth_of_the_run_and_spans_20_slowest_steps() -> None:
    # slowest worker: 100 s / 50 steps = 2 s a step; from 20 s, 20 steps: to 60 s
    assert timeline.timeline_window([final(100.0, 50), final(80.0, 80)]) == (20.0, 60.0)


def test_the_window_ends_at_the_run_s_end() -> None:
    # 100 s / 10 steps = 10 s a step: 20 + 200 s would pass the run's 100 s
    assert timeline.timeline_window([final(100.0, 10)]) == (20.0, 100.0)


def test_a_push_transfers_then_is_held_and_a_pull_is_held_then_transfers() -> None:
    records = [{KEY: Kind.PUSH, "t": 21.0, "dur": 1.0, HELD: 0.25},
               {KEY: Kind.PULL, "t": 23.0, "dur": 1.0, HELD: 0.25},
               {KEY: Kind.COMPUTE, "t": 25.0, "dur": 2.0}]
    spans = timeline.timeline_spans(records, (20.0, 40.0))
    assert spans["communicate"] == [(21.0, 0.75), (23.25, 0.75)]
    assert spans["held"] == [(21.75, 0.25), (23.0, 0.25)]
    assert spans["compute"] == [(25.0, 2.0)]


def test_an_exchange_splits_its_transfer_by_bytes_around_its_hold() -> None:
    # dur 1.5, held 0.5: 1 s of transfer, 3/4 of the bytes up: 0.75 s up, 0.25 s down
    records = [{KEY: Kind.EXCHANGE, "t": 30.0, "dur": 1.5, HELD: 0.5, "up": 300, "down": 100}]
    spans = timeline.timeline_spans(records, (20.0, 40.0))
    assert spans["communicate"] == [(30.0, 0.75), (31.25, 0.25)]
    assert spans["held"] == [(30.75, 0.5)]


def test_a_hold_longer_than_its_record_is_cut_to_it() -> None:
    records = [{KEY: Kind.PULL, "t": 30.0, "dur": 1.0, HELD: 3.0}]
    spans = timeline.timeline_spans(records, (20.0, 40.0))
    assert spans["held"] == [(30.0, 1.0)] and spans["communicate"] == [(31.0, 0.0)]


def test_a_span_reaching_into_the_window_is_kept_one_outside_is_not() -> None:
    records = [{KEY: Kind.COMPUTE, "t": 18.0, "dur": 3.0},  # 18-21: into the window
               {KEY: Kind.COMPUTE, "t": 15.0, "dur": 3.0},  # 15-18: before it
               {KEY: Kind.COMPUTE, "t": 41.0, "dur": 1.0}]  # after it
    assert timeline.timeline_spans(records, (20.0, 40.0))["compute"] == [(18.0, 3.0)]


@pytest.mark.parametrize("workers", [timeline.TIMELINE_ROWS, timeline.TIMELINE_ROWS + 8])
def test_the_rows_are_every_worker_or_an_even_spread_with_both_ends(workers: int) -> None:
    # rank r computed (workers - r) s of 100: rank 0 is the busiest, the last the least
    finals = {r: final(100.0, 10, float(workers - r)) for r in range(workers)}
    ranks = timeline.timeline_ranks(range(workers), finals)
    assert len(ranks) == timeline.TIMELINE_ROWS and ranks == sorted(ranks)
    assert ranks[0] == 0 and ranks[-1] == workers - 1
    if workers > timeline.TIMELINE_ROWS:  # 40 ranks by busyness: 32 picks of 0..39
        spread = [round(i * (workers - 1) / (timeline.TIMELINE_ROWS - 1))
                  for i in range(timeline.TIMELINE_ROWS)]
        assert ranks == sorted(workers - 1 - i for i in spread)
