"""Request numbers at the edge of the window, reported totals and warnings (found by
mutation testing of `engine.membership`)."""

from __future__ import annotations

import logging

import pytest

from asyncsync.engine.membership import SEQ_WINDOW, SeqWindow, WorkerRecord
from asyncsync.protocols.base import OutOfStep


def taken(numbers: range) -> SeqWindow:
    window = SeqWindow()
    for seq in numbers:
        window.check(0, "push", seq)
        window.take(seq)
    return window


def test_a_number_exactly_a_window_behind_is_refused_taken_or_not() -> None:
    window = taken(range(1, SEQ_WINDOW + 2))  # 1..65: the highest is 65
    with pytest.raises(OutOfStep, match="push 1 was already received"):
        window.check(0, "push", 1)  # 64 behind: out of the window
    with pytest.raises(OutOfStep):
        window.check(0, "push", 2)  # 63 behind, inside the window, but taken


def test_a_number_a_window_ahead_forgets_every_older_one() -> None:
    window = taken(range(1, 4))  # 1, 2, 3
    window.check(0, "push", 3 + SEQ_WINDOW)
    window.take(3 + SEQ_WINDOW)  # 67: 3 is now 64 behind, out of the window
    for seq in (3 + SEQ_WINDOW - 1, 3 + SEQ_WINDOW - 63):  # 66 and 4: never taken
        window.check(0, "push", seq)
    with pytest.raises(OutOfStep):
        window.check(0, "push", 3 + SEQ_WINDOW)


def test_reported_totals_keep_only_known_numbers_within_the_bounds() -> None:
    record = WorkerRecord()
    record.take_stats({"steps": 7, "loss": 0.25, "samples": True, "bytes_up": -1e300,
                       "bytes_down": 2.0**53, "compute_s": -(2.0**53), "wall_s": "3",
                       "unknown": 1.0})
    assert record.stats == {"steps": 7.0, "loss": 0.25, "bytes_down": 2.0**53,
                            "compute_s": -(2.0**53)}


def test_a_worker_sending_non_finite_updates_is_warned_about_at_3_and_10(
        caplog: pytest.LogCaptureFixture) -> None:
    record = WorkerRecord()
    with caplog.at_level(logging.WARNING, logger="asyncsync.server"):
        counts = [record.count_nonfinite(4) for _ in range(12)]
    assert counts == list(range(1, 13))
    warned = [r.getMessage() for r in caplog.records if "non-finite" in r.getMessage()]
    assert warned == [f"worker 4 has sent {n} non-finite updates (all refused); its "
                      "training has probably diverged" for n in (3, 10)]
