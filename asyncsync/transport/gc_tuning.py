"""Garbage-collector settings for processes that serve or drive the transport.

A process that has imported torch holds several hundred thousand long-lived objects, and
each full collection walks all of them (12-20 ms seen in the server, stalling its loop).
`tune_gc` moves what exists after start-up into the collector's permanent generation
(`gc.freeze`), so later collections walk only what the run itself allocates, and raises
the young generation's threshold so collections come less often.
"""

from __future__ import annotations

import gc

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
