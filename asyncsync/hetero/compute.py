"""Compute heterogeneity: per-worker slowness applied to real computation.

A profile returns, for a step whose real computation took t seconds, how long to sleep
after it. The trainer sleeps inside the compute thread, so emulated slowness counts as
computation time and leaves the event loop free.
"""

from __future__ import annotations

from typing import Protocol


class Slowdown(Protocol):
    """A compute profile: seconds of padding after a step of `compute_s` seconds."""

    def padding(self, compute_s: float) -> float: ...


class StaticSlowdown:
    """A constant factor f >= 1: every step lasts f times its real computation."""

    def __init__(self, factor: float) -> None:
        if factor < 1:
            raise ValueError(f"slowdown factor must be >= 1, got {factor}")
        self.factor = factor

    def padding(self, compute_s: float) -> float:
        return (self.factor - 1.0) * compute_s


class StepDelay:
    """A fixed sleep of `seconds` per step, whatever the computation took."""

    def __init__(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"step delay must be >= 0, got {seconds}")
        self.seconds = seconds

    def padding(self, compute_s: float) -> float:
        return self.seconds
