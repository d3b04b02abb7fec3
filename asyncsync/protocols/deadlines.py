"""Adaptive round deadlines (SDK): a deadline that follows recent round durations.

A round's duration here is how long after its first report its last one arrived, late
reports included (a report dropped because its round closed still says how long the round
would have needed), so a deadline that cuts rounds short still sees how long they take,
and a step change in round times shows in the next rounds' durations whichever way it
goes. The deadline of a new round is, over the last `window` rounds' durations:

- ``quantile = q``: their q-quantile (linear interpolation), or
- ``mad_k = k``: their median plus k times their median absolute deviation (the rule
  proposed in learning-at-home/hivemind#676).

Before `MIN_ROUNDS` durations are known there is no adaptive deadline: rounds wait for
their reports as without one.

Only a round's first on-time report opens it here: a late report of a round that has left
the window is ignored (it would come back as a round of duration 0 and push a recent one
out), and a round whose every report was withdrawn (its workers rejoined) is forgotten, so
that its next first report opens it afresh, as it restarts a fixed deadline.
"""

from __future__ import annotations

import statistics
from collections import OrderedDict

MIN_ROUNDS = 3
"""Rounds whose durations must be known before an adaptive deadline is set."""


def quantile(values: list[float], q: float) -> float:
    """The q-quantile of `values` by linear interpolation between order statistics."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median_plus_mad(values: list[float], k: float) -> float:
    """``median + k * MAD`` of `values`."""
    middle = statistics.median(values)
    return middle + k * statistics.median(abs(v - middle) for v in values)


class RoundDurations:
    """The durations of the most recent rounds, from their reports' arrival times.

    Args:
        window: how many recent rounds count.
        quantile: the deadline's quantile of them (0: use `mad_k`).
        mad_k: the deadline is median + mad_k x MAD (used when `quantile` is 0).
    """

    def __init__(self, window: int, quantile: float = 0.0, mad_k: float = 0.0) -> None:
        if window < MIN_ROUNDS:
            raise ValueError(f"window must be >= {MIN_ROUNDS}, got {window}")
        if not 0 <= quantile <= 1 or mad_k < 0 or not (quantile or mad_k):
            raise ValueError("give quantile in (0, 1] or mad_k > 0")
        self.window = window
        self.q = quantile
        self.k = mad_k
        self._first: OrderedDict[object, float] = OrderedDict()  # round -> first report
        self._longest: dict[object, float] = {}  # round -> its longest report so far

    def report(self, round_key: object, t: float, late: bool = False) -> None:
        """A report of round `round_key` arrived at time `t` (`late`: after its round
        closed; it opens no round)."""
        first = self._first.get(round_key)
        if first is None:
            if late:
                return
            self._first[round_key] = t
            self._longest[round_key] = 0.0
            while len(self._first) > self.window + 1:  # the window and an open round
                old, _ = self._first.popitem(last=False)
                self._longest.pop(old, None)
            return
        self._longest[round_key] = max(self._longest[round_key], t - first)

    def forget(self, round_key: object) -> None:
        """Drop round `round_key`, which holds no report any more (its workers left)."""
        self._first.pop(round_key, None)
        self._longest.pop(round_key, None)

    def deadline(self) -> float | None:
        """The deadline for a round opening now, from the last `window` rounds (None: too
        few rounds seen). An open round (its first report came) is not yet opening."""
        durations = list(self._longest.values())[-self.window:]
        if len(durations) < MIN_ROUNDS:
            return None
        return quantile(durations, self.q) if self.q else median_plus_mad(durations, self.k)
