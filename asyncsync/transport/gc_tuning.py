"""Garbage-collector settings for processes that serve or drive the transport.

A process that has imported torch holds several hundred thousand long-lived objects, and
each full collection walks all of them (12-20 ms seen in the server, stalling its loop).
`tune_gc` moves what exists after start-up into the collector's permanent generation
(`gc.freeze`), so later collections walk only what the run itself allocates, and raises
the young generation's threshold so collections come less often.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 20_000
"""Allocations (less deallocations) between young-generation collections (Python's
default: 700)."""

_tuned = False


def tune_gc() -> None:
    """Freeze the objects alive now and raise the young threshold, once per process (later
    calls do nothing, so embedding several servers or transports costs one collection)."""
    global _tuned
    if _tuned:
        return
    _tuned = True
    gc.collect()
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(YOUNG_THRESHOLD, young), middle, old)


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
