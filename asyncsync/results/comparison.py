"""Comparing runs: speedups against the baseline, and 95% intervals over repeats (and
how the table writes them)."""

from __future__ import annotations

import math
from typing import Any

from asyncsync.runlog.reading import label, sweep_suffix, unswept_name


def speedup(summary: dict[str, Any], base: dict[str, Any] | None) -> tuple[float | None, bool]:
    """Baseline's time to target / this run's, and whether that is only a lower bound.

    When the baseline never reached the target, its time to target is at least its wall
    time, so ``base wall / this run's time`` is a lower bound (flagged True). None when
    this run did not reach the target, or reached it at its start (t = 0: no ratio).
    """
    ttt = summary.get("time_to_target_s")
    if not base or not ttt:
        return None, False
    if base.get("time_to_target_s") is not None:  # 0.0 too: reached at its start
        return base["time_to_target_s"] / ttt, False
    if base.get("wall_s"):
        return base["wall_s"] / ttt, True
    return None, False


T_95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
"""Student's t quantile 0.975 for 1..30 degrees of freedom (1.96 beyond)."""


def interval(values: list[float]) -> tuple[float, float | None]:
    """The mean and the half-width of its 95% t-interval (None for a single value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    t = T_95[n - 2] if n - 1 <= len(T_95) else 1.96
    return mean, t * sd / math.sqrt(n)


def interval_ends(values: list[float], most: float | None = None,
                  ) -> tuple[float, float, float] | None:
    """The mean of `values` and the ends of its 95% t-interval, clipped to the figure's
    range: at least 0 (a time, a rate, a ratio, a count is never negative) and at most
    `most` (an accuracy or a proportion: 1). Few repeats make a wide symmetric interval
    that would reach past them; it is shown clipped, not moved. None: under 2 values."""
    if len(values) < 2:
        return None
    mean, half = interval(values)
    assert half is not None  # (2 values or more)
    high = mean + half
    return mean, max(0.0, mean - half), high if most is None else min(most, high)


def paired_speedups(group: list[dict[str, Any]], base: list[dict[str, Any]]
                    ) -> tuple[list[float], bool]:
    """Each repeat's speedup against the baseline's repeat of the same index (seed), and
    whether any is only a lower bound."""
    by_repeat = {b.get("repeat", 0): b for b in base}
    values, bound = [], False
    for s in group:
        value, lower = speedup(s, by_repeat.get(s.get("repeat", 0)))
        if value is not None:
            values.append(value)
            bound |= lower
    return values, bound


def targets(summaries: list[dict[str, Any]]) -> list[float]:
    """The target accuracies of the summaries, each once, in increasing order (runs of
    several recipes may differ)."""
    return sorted({s["target_accuracy"] for s in summaries if s.get("target_accuracy")})


def is_baseline(summary: dict[str, Any], baseline: str) -> bool:
    """Whether `summary` is a run of `baseline` (a run name or recipe/name), at any sweep
    point: each sweep point is compared with its own baseline."""
    suffix = sweep_suffix(summary.get("sweep") or {})
    return baseline + suffix in (summary.get("run"), label(summary))


def baseline_choices(summaries: list[dict[str, Any]]) -> str:
    """The names `is_baseline` takes for these runs (name and recipe/name, without a sweep
    point), for a message refusing another."""
    bare = [{**s, "run": unswept_name(s["run"], s.get("sweep") or {})} for s in summaries]
    swept = any(s.get("sweep") for s in summaries)
    return ", ".join(sorted({s["run"] for s in bare} | {label(s) for s in bare})) + (
        " (each sweep point is compared with the baseline's run at the same point)" * swept)


def groups(summaries: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Summaries grouped by run (recipe/run), repeats together, in first-seen order."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for s in summaries:
        grouped.setdefault(label(s), []).append(s)
    return list(grouped.values())


def fmt(value: Any, spec: str = ".3f", suffix: str = "") -> str:
    """`value` as the table writes it (``-``: none, or not a number)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:{spec}}{suffix}"


CLIPPED = ("[low, high]: a 95% interval that reached past what the figure can be (below 0, "
           "or an accuracy or proportion above 1), shown clipped there")
"""The legend of a clipped interval (`mean_text`'s ``[low, high]``)."""


def mean_text(values: list[float], spec: str, total: int, suffix: str = "",
              most: float | None = None) -> str:
    """``mean±half-width`` of `values` (``mean [low, high]`` where the interval is clipped,
    see `interval_ends`), with ``(k/n)`` when only k of n repeats have one."""
    if not values:
        return "-"
    mean, half = interval(values)
    text = fmt(mean, spec, suffix)
    ends = interval_ends(values, most)
    if ends is not None and half is not None:
        _, low, high = ends
        if (low, high) == (mean - half, mean + half):
            text += "±" + fmt(half, spec)
        else:
            text += f" [{fmt(low, spec)}, {fmt(high, spec)}]"
    return text if len(values) == total else f"{text} ({len(values)}/{total})"
