"""Mutation testing of the round protocols found one rule of the adaptive deadline that no
test held: a late report of a round that has left the window opens no round (it would
come back as a round of duration 0 and push a recent one out). Deadlines by hand."""

from __future__ import annotations

import pytest

from asyncsync.protocols.deadlines import RoundDurations


def test_a_late_report_of_a_round_past_the_window_changes_no_deadline() -> None:
    durations = RoundDurations(window=3, quantile=0.25)
    # rounds a..e, each opened at 10 i and last reported i + 1 seconds later
    for index, key in enumerate("abcde"):
        durations.report(key, 10.0 * index)
        durations.report(key, 10.0 * index + index + 1)
    # the last three durations 3, 4, 5: their 0.25-quantile is at position 0.5, 3.5
    assert durations.deadline() == pytest.approx(3.5)
    durations.report("a", 100.0, late=True)  # a left the window (it keeps 3 + the open one)
    assert durations.deadline() == pytest.approx(3.5)
    durations.report("c", 29.0, late=True)  # c is in it: its duration becomes 9
    assert durations.deadline() == pytest.approx(4.5)  # 4, 5, 9: 4 + 0.5 (5 - 4)
