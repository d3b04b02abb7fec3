"""The report's figures on edge cases of a new user's studies, checked against values
worked out by hand."""

from __future__ import annotations

from asyncsync.results.comparison import speedup


def test_a_baseline_at_its_target_from_the_first_evaluation_is_no_lower_bound() -> None:
    """A baseline whose first evaluation (t = 0) met the target reached it: 0 s / 2 s,
    not its wall time / 2 s flagged as a lower bound."""
    assert speedup({"time_to_target_s": 2.0}, {"time_to_target_s": 0.0, "wall_s": 10.0}
                   ) == (0.0, False)
    assert speedup({"time_to_target_s": 2.0}, {"time_to_target_s": None, "wall_s": 10.0}
                   ) == (5.0, True)
    assert speedup({"time_to_target_s": 0.0}, {"time_to_target_s": 4.0}) == (None, False)
