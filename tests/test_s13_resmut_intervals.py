"""The 95% intervals and speedups the table prints, against hand-computed values and an
independent Student's t (mutation testing of `asyncsync.results.comparison`)."""

from __future__ import annotations

import math
import statistics

import pytest

from asyncsync.results import comparison
from asyncsync.results.comparison import interval, interval_ends, mean_text, speedup


def t_cdf_above_zero(x: float, dof: int, steps: int = 4000) -> float:
    """P(0 < T < x) for Student's t with `dof` degrees of freedom (Simpson's rule)."""
    scale = math.gamma((dof + 1) / 2) / (math.sqrt(dof * math.pi) * math.gamma(dof / 2))
    h = x / steps
    total = sum((1 if i in (0, steps) else 4 if i % 2 else 2)
                * (1 + (i * h) ** 2 / dof) ** (-(dof + 1) / 2) for i in range(steps + 1))
    return float(scale * total * h / 3)


@pytest.mark.parametrize("dof", range(1, 31))
def test_each_t_quantile_is_the_0975_quantile_to_3_decimals(dof: int) -> None:
    quantile = comparison.T_95[dof - 1]
    assert t_cdf_above_zero(quantile - 0.0005, dof) < 0.475 < t_cdf_above_zero(
        quantile + 0.0005, dof)


@pytest.mark.parametrize(("n", "t"), [(2, 12.706), (5, 2.776), (31, 2.042), (32, 1.96)])
def test_the_half_width_is_t_times_the_sample_sd_over_root_n(n: int, t: float) -> None:
    values = [float(k * k % 7) for k in range(n)]  # not all equal
    mean, half = interval(values)
    assert mean == pytest.approx(statistics.fmean(values))
    assert half == pytest.approx(t * statistics.stdev(values) / math.sqrt(n))


def test_one_value_has_no_interval_and_two_have_one() -> None:
    assert interval([3.0]) == (3.0, None) and interval_ends([3.0]) is None
    # [1, 3]: mean 2, sd sqrt(2), half 12.706 * sqrt(2) / sqrt(2)
    assert interval([1.0, 3.0]) == pytest.approx((2.0, 12.706))
    assert interval_ends([1.0, 3.0]) == pytest.approx((2.0, 0.0, 14.706))
    assert interval_ends([1.0, 3.0], most=1.0) == pytest.approx((2.0, 0.0, 1.0))


def test_mean_text_clips_only_where_the_interval_leaves_the_range() -> None:
    # [0.8, 1.0]: mean 0.9, half 12.706 * sqrt(0.02) / sqrt(2) = 1.2706: both ends out
    assert mean_text([0.8, 1.0], ".2f", 2, most=1.0) == "0.90 [0.00, 1.00]"
    # [10, 12, 14]: mean 12, sd 2, half 4.303 * 2 / sqrt(3) = 4.969: inside
    assert mean_text([10.0, 12.0, 14.0], ".1f", 3, "x") == "12.0x±5.0"
    # only the top clipped: [0.90, 0.96, 0.99] has mean 0.95, half > 0.05, low > 0
    low = 0.95 - 4.303 * statistics.stdev([0.90, 0.96, 0.99]) / math.sqrt(3)
    assert mean_text([0.90, 0.96, 0.99], ".3f", 3, most=1.0) == f"0.950 [{low:.3f}, 1.000]"


def test_mean_text_says_over_how_many_repeats() -> None:
    assert mean_text([2.0], ".1f", 3) == "2.0 (1/3)"
    assert mean_text([2.0], ".1f", 1) == "2.0"
    assert mean_text([], ".1f", 3) == "-"


def test_a_baseline_with_no_wall_time_gives_no_speedup() -> None:
    assert speedup({"time_to_target_s": 5.0}, {"time_to_target_s": None, "wall_s": 0.0}
                   ) == (None, False)
    assert speedup({"time_to_target_s": 5.0}, {"time_to_target_s": None, "wall_s": 20.0}
                   ) == (4.0, True)
