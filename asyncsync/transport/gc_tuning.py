"""Garbage-collector settings for processes that serve or drive the transport.

A process that has imported torch holds several hundred thousand long-lived objects, and
each full collection walks all of them (12-20 ms seen in the server, stalling its loop).
While a server or an HTTP worker is open (`GcHold`), the young generation's threshold is
raised to `YOUNG_THRESHOLD`, so collections come less often; the last one to close puts
the threshold back. The first hold of the process also moves what exists then into the
collector's permanent generation (`gc.freeze`), once, so later collections walk only what
runs allocate; that is not undone (reference counting still frees those objects; only
garbage cycles among them wait for a `gc.unfreeze()`). `set_enabled(False)` leaves the
collector alone.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 20_000
"""Allocations (less deallocations) between young-generation collections (Python's
default: 700)."""

_enabled = True
_frozen = False  # the start-up objects were frozen (once per process)
_holds = 0  # open holds
_restore: tuple[tuple[int, int, int], int] | None = None  # (the thresholds before, ours)


def set_enabled(enabled: bool) -> None:
    """Whether servers and HTTP workers opened from now on tune the collector (default:
    True). An embedding program that manages the collector itself calls
    ``set_enabled(False)`` before its first server or worker starts."""
    global _enabled
    _enabled = bool(enabled)


class GcHold:
    """The collector tuned while held: `release` (idempotent) ends this hold, and the last
    hold of the process to end puts the young threshold back (unless the program set
    another meanwhile). Made while tuning is disabled, it holds nothing."""

    def __init__(self) -> None:
        global _frozen, _holds, _restore
        self.held = _enabled
        if not self.held:
            return
        if not _frozen:
            _frozen = True
            gc.collect()
            gc.freeze()
        if _holds == 0:
            young, middle, old = before = gc.get_threshold()
            ours = max(YOUNG_THRESHOLD, young)
            gc.set_threshold(ours, middle, old)
            _restore = (before, ours)
        _holds += 1

    def release(self) -> None:
        """End this hold (a second call does nothing)."""
        global _holds, _restore
        if not self.held:
            return
        self.held = False
        _holds -= 1
        if _holds == 0 and _restore is not None:
            before, ours = _restore
            _restore = None
            if gc.get_threshold()[0] == ours:  # (else the program set its own)
                gc.set_threshold(*before)


def tune_gc() -> None:
    """Tune the collector for the rest of the process (a hold never released), as a
    virtual-time run's process does."""
    GcHold()


@contextmanager
def young_threshold(at_least: int) -> Iterator[None]:
    """Collect the young generation only every `at_least` allocations inside the block,
    then restore the threshold.

    For a virtual-time run of N workers: the objects of every worker's request in flight
    (frames, futures, headers) live until its virtual wait ends, that is while the other
    N - 1 workers make theirs. Collected every 20,000 allocations, they outlived each
    young collection and were walked again by the older ones: at 10,000 asp workers a
    fifth of the host time (6.3 of 30 s: 631 young, 56 middle, 5 full collections).
    A threshold proportional to N lets most of them die first. Only reference cycles wait
    for a collection, and a simulated exchange makes about one object of those.
    """
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, at_least), middle, old)
    try:
        yield
    finally:
        gc.set_threshold(young, middle, old)
