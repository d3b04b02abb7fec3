"""The one clock of everything below the supervisor: the running event loop's time.

In real mode the loop's time is the monotonic clock; a virtual-time loop makes it virtual,
and every timestamp, deadline and sleep of the engine, the protocols, the compute
profiles and the link emulation follows. Only this module (and the supervisor: runner,
dashboard, report, CLI) may read the wall clock.
"""

from __future__ import annotations

import asyncio
import time


def now() -> float:
    """Seconds on the running loop's clock; the monotonic clock outside a loop (set-up)."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


class Stopwatch:
    """Seconds since `start()` (or creation) on the one clock."""

    def __init__(self) -> None:
        self._t0 = now()

    def start(self, elapsed: float = 0.0) -> None:
        """Restart, as if `elapsed` seconds had already passed."""
        self._t0 = now() - elapsed

    def elapsed(self) -> float:
        return now() - self._t0
