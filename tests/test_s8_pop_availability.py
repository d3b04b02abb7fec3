"""A worker's online intervals answered by bisection agree with the plain definition at
every time, at and between the intervals' ends."""

from __future__ import annotations

import math
import random

from asyncsync.hetero.availability import OnlineTimes


def _by_definition(intervals: tuple[tuple[float, float], ...], t: float,
                   ) -> tuple[bool, float, float | None]:
    """online at t; when it next goes offline (t: offline now); when it is next online."""
    inside = [stop for start, stop in intervals if start <= t < stop]
    later = [max(start, t) for start, stop in intervals if t < stop]
    return bool(inside), inside[0] if inside else t, later[0] if later else None


def test_online_offline_and_next_online_follow_the_definition() -> None:
    rng = random.Random(7)
    for _ in range(200):
        ends = sorted(rng.sample(range(60), 2 * rng.randrange(0, 10)))
        intervals = tuple((float(ends[i]), float(ends[i + 1])) for i in range(0, len(ends), 2))
        if intervals and rng.random() < 0.3:  # one open to the end (clipped to the budget)
            intervals = (*intervals[:-1], (intervals[-1][0], math.inf))
        times = OnlineTimes(intervals)
        for t in (x / 2 for x in range(-2, 130)):
            assert (times.online_at(t), times.offline_at(t), times.online_from(t)) == \
                _by_definition(intervals, t), (intervals, t)
