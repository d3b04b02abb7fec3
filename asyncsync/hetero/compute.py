"""Compute heterogeneity: per-worker slowdown applied to real computation.

A factor f makes a step that took t seconds of real computation last f * t: the trainer
sleeps (f - 1) * t after computing, inside the compute thread, so the emulated slowness
counts as computation time and leaves the event loop free.
"""

from __future__ import annotations


class StaticSlowdown:
    """A constant factor >= 1 for one worker."""

    def __init__(self, factor: float) -> None:
        if factor < 1:
            raise ValueError(f"slowdown factor must be >= 1, got {factor}")
        self.factor = factor

    def padding(self, compute_s: float) -> float:
        """Seconds to sleep after a step whose real computation took `compute_s`."""
        return (self.factor - 1.0) * compute_s
