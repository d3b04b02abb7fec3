"""The staleness functions at their edges, from Xie et al.'s definitions.

Hinge: ``s(d) = 1`` for ``d <= b``, else ``1 / (a (d - b) + 1)``: staleness b itself is
still weighted 1. Polynomial: ``(d + 1)^-a``, so a fresh update (d = 0) weighs 1.
"""

from __future__ import annotations

import pytest

from asyncsync.protocols.staleness import StalenessOptions


@pytest.mark.parametrize(("d", "expected"), [(0, 1.0), (4, 1.0), (5, 1 / 11), (7, 1 / 31)])
def test_hinge_weighs_one_up_to_and_including_b(d: int, expected: float) -> None:
    options = StalenessOptions(staleness_fn="hinge", hinge_a=10.0, b=4)
    assert options.staleness_weight(d) == pytest.approx(expected)


@pytest.mark.parametrize(("d", "expected"), [(0, 1.0), (3, 0.5), (8, 1 / 3)])
def test_polynomial_is_d_plus_one_to_the_minus_a(d: int, expected: float) -> None:
    assert StalenessOptions(a=0.5).staleness_weight(d) == pytest.approx(expected)
