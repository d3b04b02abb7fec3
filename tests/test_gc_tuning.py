"""The transport's garbage-collector settings (`asyncsync.transport.gc_tuning`)."""

from __future__ import annotations

import gc

from asyncsync.transport import gc_tuning


def test_tune_gc_freezes_start_up_objects_and_raises_the_young_threshold() -> None:
    gc_tuning.tune_gc()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold()[0] >= gc_tuning.YOUNG_THRESHOLD


def test_tune_gc_runs_once_per_process() -> None:
    gc_tuning.tune_gc()
    frozen = gc.get_freeze_count()
    kept = [object() for _ in range(100)]
    gc_tuning.tune_gc()
    assert gc.get_freeze_count() == frozen
    assert kept
