"""Round policies (SDK): their options (`Cutoff`, `CUTOFF_OPTIONS`) and the adaptive
deadline, which follows recent round durations (`RoundDurations`).

The options are defined here, below `base`, so that `base.no_round_policies` refuses
exactly the keys a round protocol takes (`rounds` re-exports both names).

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

import math
import statistics
from collections import OrderedDict
from dataclasses import dataclass, fields
from typing import Any

from asyncsync.schema import check_fields, option

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


def _default(name: str) -> Any:
    """The default of one of `Cutoff`'s options."""
    return next(item.default for item in fields(Cutoff) if item.name == name)


@dataclass(frozen=True, kw_only=True)
class Cutoff:
    """Parameters that let a round close without its slowest members (see the module
    docstring); a protocol's parameter dataclass derives from this class to offer them."""

    backup_workers: int = option(0, lambda v: v >= 0, "must be >= 0",
                                 "b: a round closes with the first N - b pushes; later "
                                 "ones are dropped")
    deadline_s: float = option(0.0, lambda v: 0 <= v < math.inf, "must be >= 0 and finite",
                               "a round closes this long after its first push with what "
                               "arrived (0: no deadline)")
    overcommit: float = option(0.0, lambda v: 0 <= v < math.inf, "must be >= 0 and finite",
                               "over-selection: a round closes with its first k reports: "
                               "fedavg's k of ceil(k (1 + o)) drawn, else ceil(M / (1 + o)) "
                               "of its M members (0: off)")
    deadline_quantile: float = option(0.0, lambda v: 0 <= v <= 1, "must be in [0, 1]",
                                      "adaptive deadline: this quantile of recent round "
                                      "durations (0: off)")
    deadline_mad_k: float = option(0.0, lambda v: 0 <= v < math.inf,
                                   "must be >= 0 and finite",
                                   "adaptive deadline: median + k MADs of recent round "
                                   "durations (0: off)")
    deadline_window: int = option(10, lambda v: v >= MIN_ROUNDS, f"must be >= {MIN_ROUNDS}",
                                  "adaptive deadline: how many recent rounds it follows")

    def __post_init__(self) -> None:
        check_fields(self)
        self.check_cutoff()

    def check_cutoff(self) -> None:
        """Refuse combinations of these options that contradict each other (a subclass
        with a ``__post_init__`` of its own calls this)."""
        chosen = [name for name in ("deadline_s", "deadline_quantile", "deadline_mad_k")
                  if getattr(self, name)]
        if len(chosen) > 1:
            raise ValueError(f"{' and '.join(chosen)}: choose one kind of deadline")
        if self.backup_workers and self.overcommit:
            raise ValueError("backup_workers and overcommit: choose one way to close a round "
                             "early")
        if self.deadline_window != _default("deadline_window") and not self.adaptive:
            raise ValueError("deadline_window: only an adaptive deadline (deadline_quantile "
                             "or deadline_mad_k) follows recent rounds; set one, or leave "
                             "this key out")

    def refuse_cutoff(self, protocol: str, why: str) -> None:
        """Refuse any of these options set to other than its default (a protocol whose
        parameters inherit them but whose rounds cannot honour them, and so name them in
        ``REFUSED_OPTIONS = CUTOFF_OPTIONS``, which leaves them out of its listings),
        naming the key."""
        for item in fields(Cutoff):
            if getattr(self, item.name) != item.default:
                raise ValueError(f"{item.name}: not offered by {protocol} ({why})")

    def check_workers(self, workers: int) -> None:
        """Refuse backup workers that would leave a round of `workers` nobody to wait for."""
        if self.backup_workers >= workers:
            raise ValueError(f"backup_workers: must be < workers ({workers}), "
                             f"got {self.backup_workers}")

    @property
    def adaptive(self) -> bool:
        """Whether the deadline follows recent round durations."""
        return bool(self.deadline_quantile or self.deadline_mad_k)

    @property
    def cuts(self) -> bool:
        """Whether rounds may close without some members (so late pushes can happen)."""
        return bool(self.backup_workers or self.deadline_s or self.overcommit
                    or self.adaptive)


CUTOFF_OPTIONS = frozenset(item.name for item in fields(Cutoff))
"""The round-policy options (`Cutoff`'s fields)."""
