"""A report that arrives at its round's deadline instant is on time.

With a steady straggler every round lasts the same, so an adaptive deadline (a quantile, or
the median plus k MADs, of recent round durations) lands exactly on the straggler's
arrival. The deadline's timer fired first at that instant and the report was dropped:
every one of the straggler's reports was lost, and no round ended any sooner.
"""

from __future__ import annotations

import pytest

from asyncsync.engine.settings import ServerSettings
from asyncsync.protocols.bsp import BspParams
from asyncsync.study.simulation import run_virtual
from tests.helpers import batches_of, tiny_data, tiny_model


@pytest.mark.parametrize("policy", [{"deadline_quantile": 0.5}, {"deadline_mad_k": 1.0}])
def test_a_steady_stragglers_reports_are_not_dropped_at_the_deadline_instant(
        policy: dict[str, float]) -> None:
    x, y = tiny_data()
    core, _ = run_virtual("bsp", tiny_model, lambda rank: batches_of(x, y, rank),
                          [0.0, 0.0, 0.03, 0.09], settings=ServerSettings(time_s=3.0),
                          params=BspParams(**policy))
    assert core.store.version > 20
    assert core.rule.dropped() == 0
