"""PNG plots of finished runs, from their logs (needs the `plot` extra: matplotlib).

- ``accuracy.png``: test accuracy of the global model vs wall (or virtual) time, one line
  per run (with repeats, their mean and a min-max band), the target accuracy as a dashed
  line and each repeat's time to target as a dot; with several sweep points, a panel each.
- ``time_to_target.png``: a bar per run (each sweep point its own), the mean time to target
  over the repeats that reached it with the table's 95% interval, a dot per repeat, ``k/n``
  where only k of n repeats reached it and ``never`` where none did.
- ``compute_proportion.png``: compute proportion per worker, grouped by run.
- ``timeline-<run>.png``: per worker (at most 32 of a larger run), when it computed,
  communicated and waited, over a window of the run past its start-up.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from asyncsync.results.comparison import (
    groups,
    interval,
    interval_ends,
    is_baseline,
    paired_speedups,
    targets,
)
from asyncsync.results.pyplot import pyplot
from asyncsync.results.timeline import plot_timeline
from asyncsync.runlog.reading import label, sweep_suffix, unswept_name


def repeat_curves(group: list[dict[str, Any]]) -> tuple[Any, Any]:
    """Every repeat's accuracy at all the repeats' evaluation times (one row per repeat).

    A repeat that ended earlier (at its target, with stop_at_target) holds its last
    accuracy, so the mean of repeats that all reached the target reaches the target line.
    """
    times = np.unique(np.concatenate([np.array(_evaluated(s))[:, 0] for s in group]))
    return times, np.array([np.interp(times, *np.array(_evaluated(s)).T) for s in group])


def _evaluated(summary: dict[str, Any]) -> list[list[float]]:
    """A run's evaluations ``[t, accuracy]`` that have an accuracy (one that was not a
    number is null in summary.json: left out, the line drawn past it)."""
    return [point for point in summary.get("evaluations") or [] if point[1] is not None]


def plot_accuracy(summaries: list[dict[str, Any]], path: Path, names: list[str]) -> Path:
    """Accuracy vs time per run; with repeats, their mean and a band from the lowest to the
    highest repeat. With several sweep points, a panel per point, a colour per run."""
    plt = pyplot()
    aims = targets(summaries)
    runs: dict[str, list[dict[str, Any]]] = {}
    for s, name in zip(summaries, names, strict=True):
        if _evaluated(s):
            runs.setdefault(name, []).append(s)
    points = list(dict.fromkeys(_point(group[0]) for group in runs.values()))
    rows = -(-len(points) // 3)  # at most 3 panels a row, rows as full as they can be
    cols = -(-len(points) // rows)
    fig, axes = plt.subplots(rows, cols, squeeze=False, sharex=True, sharey=True,
                             layout="constrained",
                             figsize=(8, 4.5) if cols == 1 else (4 * cols, 2.8 * rows + 1.2))
    colors = _colors(summaries, names)
    handles: dict[str, Any] = {}
    sizes: set[int] = set()
    marked = False
    extent = list(aims)  # every band whole on the y axis
    for name, group in runs.items():
        point = _point(group[0])
        ax = axes.flat[points.index(point)]
        base = name.removesuffix(point)
        times, curves = repeat_curves(group)
        (line,) = ax.plot(times, curves.mean(axis=0), linewidth=1.6, color=colors[base])
        extent += [float(curves.min()), float(curves.max())]
        handles.setdefault(base, line)
        sizes.add(len(group))
        if len(group) > 1:
            ax.fill_between(times, curves.min(axis=0), curves.max(axis=0), color=colors[base],
                            alpha=0.2, linewidth=0)
        reached = [(s["time_to_target_s"], s["target_accuracy"]) for s in group
                   if s.get("time_to_target_s") is not None and s.get("target_accuracy")]
        if reached:  # each repeat's dot on its own run's target
            ax.plot(*zip(*reached, strict=True), "o", color=colors[base], markersize=4)
            marked = True
    if max(sizes, default=1) > 1:  # these entries in grey, no run's colour
        many = f"{sizes.pop()}" if len(sizes) == 1 else f"{min(sizes)}-{max(sizes)}"
        handles[f"line: mean of {many} repeats"] = plt.Line2D([], [], color="grey")
        handles["band: min-max over repeats"] = plt.Rectangle((0, 0), 1, 1, color="grey",
                                                              alpha=0.3, linewidth=0)
    if marked:
        handles["time to target (a dot per repeat)"] = plt.Line2D(
            [], [], marker="o", markersize=4, linestyle="none", color="grey")
    for ax, point in zip(axes.flat, points, strict=False):
        for target in aims:
            handles[f"target {target:g}"] = ax.axhline(target, color="grey", linestyle="--",
                                                       linewidth=1)
        ax.set_title(_point_text(point), fontsize="medium")
        ax.grid(alpha=0.3)
    if extent:  # the panels share their y axis
        pad = 0.04 * (max(extent) - min(extent)) + 0.01
        axes[0, 0].set_ylim(min(extent) - pad, max(extent) + pad)
    clock = _clock(summaries)
    for i, ax in enumerate(axes.flat):
        if i >= len(points):
            ax.set_visible(False)
        elif i + cols >= len(points):  # the lowest panel of its column
            ax.xaxis.set_tick_params(labelbottom=True)
            ax.set_xlabel(f"{clock} time (s)")
    for ax in axes[:, 0]:
        ax.set_ylabel("test accuracy")
    title = f"Accuracy of the global model vs {clock} time"
    if cols == 1:
        point = _point_text(points[0])
        axes[0, 0].set_title(f"{title} ({point})" if point else title)
        axes[0, 0].legend(handles.values(), handles.keys(), loc="lower right",
                          fontsize="small")
    else:
        fig.suptitle(title)
        fig.legend(handles.values(), handles.keys(), loc="outside lower center",
                   ncol=min(len(handles), 4), fontsize="small")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


@dataclass(frozen=True)
class TargetBars:
    """What `plot_time_to_target` drew, one entry per run in the plot's order.

    Attributes:
        path: the PNG written.
        labels: the runs' tick labels.
        heights: each bar's height (None: no bar, no repeat reached the target).
        errors: each error bar's half-width above the bar (None: none drawn, fewer than 2
            values).
        bottoms: where each error bar ends below (the interval's low end, at least 0).
        dots: each run's dots, one per repeat that reached the target.
        notes: the text over each bar: ``k/n`` repeats reached the target, ``never``, or "".
        ylabel: the y-axis's label; title: the title.
    """

    path: Path
    labels: list[str]
    heights: list[float | None]
    errors: list[float | None]
    bottoms: list[float | None]
    dots: list[list[float]]
    notes: list[str]
    ylabel: str
    title: str


def plot_time_to_target(summaries: list[dict[str, Any]], path: Path, names: list[str]
                        ) -> TargetBars:
    """A bar per run (repeats together, each sweep point its own): the mean time to target
    over the repeats that reached it, the table's 95% interval, a dot per repeat, ``k/n``
    where only k of n repeats reached it, ``never`` (no bar) where none did and ``failed``
    where every repeat failed (k/n counts failed repeats in n, as the table does). The
    summaries must have a target accuracy."""
    plt = pyplot()
    named = {label(s): name for s, name in zip(summaries, names, strict=True)}
    ran = [(s, n) for s, n in zip(summaries, names, strict=True) if "error" not in s]
    colors = _colors([s for s, _ in ran], [n for _, n in ran])  # as accuracy.png's lines
    runs = groups(summaries)
    keys = [(named[label(g[0])].removesuffix(_point(g[0])), _point(g[0])) for g in runs]
    crowded = sum(len(base + point) + 2 for base, point in keys) > 70  # the axis's width
    fig, ax = plt.subplots(figsize=(8, 4.5))
    names_drawn, heights, errors, bottoms, dots_drawn, notes = [], [], [], [], [], []
    highest = 0.0
    for x, (group, (base, point)) in enumerate(zip(runs, keys, strict=True)):
        if x and base != keys[x - 1][0] and point != keys[x - 1][1]:
            ax.axvline(x - 0.5, color="grey", linewidth=0.8, linestyle=":")  # the next block
        times = [float(s["time_to_target_s"]) for s in group
                 if s.get("time_to_target_s") is not None]
        height = error = bottom = None
        dots: list[float] = []
        if times:
            mean, _ = interval(times)
            (bar,) = ax.bar(x, mean, width=0.7, color=colors[base])
            height = float(bar.get_height())
            if (ends := interval_ends(times)) is not None:  # stops at 0: no time is negative
                caps = ax.errorbar(x, mean, yerr=[[mean - ends[1]], [ends[2] - mean]],
                                   fmt="none", ecolor="black", capsize=4, linewidth=1)
                low, high = caps.lines[2][0].get_segments()[0][:, 1]
                error, bottom = float(high) - height, float(low)
            offsets = np.linspace(-0.15, 0.15, len(times)) if len(times) > 1 else [0.0]
            (line,) = ax.plot(x + np.asarray(offsets), times, "o", color="black",
                              markersize=3)
            dots = [float(t) for t in line.get_ydata()]
        top = max([height + (error or 0.0), *dots]) if height is not None else 0.0
        highest = max(highest, top)
        failed = all("error" in s for s in group)
        note = ("failed" if failed else "never") if not times else \
            "" if len(times) == len(group) else \
            f"{len(times)}/{len(group)}"
        if note:
            note = ax.annotate(note, (x, top), xytext=(0, 3), textcoords="offset points",
                               ha="center", va="bottom", fontsize="small",
                               rotation=90 if crowded and not times else 0,
                               style="normal" if times else "italic").get_text()
        names_drawn.append(base + point)
        heights.append(height)
        errors.append(error)
        bottoms.append(bottom)
        dots_drawn.append(dots)
        notes.append(note)
    ax.set_xticks(range(len(names_drawn)), names_drawn, rotation=40 if crowded else 0,
                  fontsize="x-small" if crowded else "small",
                  ha="right" if crowded else "center", rotation_mode="anchor")
    ax.set_xlim(-0.6, len(names_drawn) - 0.4)
    ax.set_ylim(0, 1.12 * highest or 1.0)
    ax.set_ylabel(f"{_clock(summaries)} time to target (s)")
    listed = ", ".join(f"{t:g}" for t in targets(summaries))
    ax.set_title(f"Time to test accuracy {listed}\n" if "," not in listed else
                 f"Time to each run's test accuracy target ({listed})\n", fontsize="medium")
    ax.set_title("bar: mean of the repeats that reached it; whisker: its 95% interval "
                 "(cut at 0); dot: a repeat; k/n: k of n repeats reached it",
                 fontsize="x-small", loc="left")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return TargetBars(path, [tick.get_text() for tick in ax.get_xticklabels()], heights,
                      errors, bottoms, dots_drawn, notes, ax.get_ylabel(),
                      ax.get_title().strip())


def _point(summary: dict[str, Any]) -> str:
    """The sweep point a run's name ends with (``@key=value``, or "")."""
    return sweep_suffix(summary.get("sweep") or {})


def _point_text(point: str) -> str:
    """A sweep point for a title: ``@a=1@b=2`` as ``a=1, b=2``."""
    return point[1:].replace("@", ", ")


def _colors(summaries: list[dict[str, Any]], names: list[str]) -> dict[str, str]:
    """A colour per run of the recipe, its sweep points and repeats sharing it; never the
    cycle's grey (C7), which marks what is no run's (bands, dots, the target)."""
    bases = [n.removesuffix(_point(s)) for s, n in zip(summaries, names, strict=True)]
    palette = [f"C{i}" for i in range(10) if i != 7]
    return {base: palette[i % len(palette)] for i, base in enumerate(dict.fromkeys(bases))}


def _clock(summaries: list[dict[str, Any]]) -> str:
    """``virtual`` when every run ran on the virtual clock, else ``wall``."""
    virtual = bool(summaries) and all(s.get("clock") == "virtual" for s in summaries)
    return "virtual" if virtual else "wall"


PER_WORKER_BARS = 16
"""Above this many workers, a box of their spread, not a bar each (slow, unreadable)."""


def plot_compute_proportion(summaries: list[dict[str, Any]], path: Path,
                            names: list[str]) -> Path:
    plt = pyplot()
    done = [(s, n) for s, n in zip(summaries, names, strict=True) if "error" not in s]
    workers = max((len(s["compute_proportion_per_worker"]) for s, _ in done), default=1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(done) + 2), 4.5))
    if workers > PER_WORKER_BARS:  # box: quartiles, whiskers: min and max
        ax.boxplot([[v or 0.0 for v in s["compute_proportion_per_worker"]] for s, _ in done],
                   positions=range(len(done)), widths=0.5, whis=(0, 100))
        ax.set_title(f"Time computing / wall time: spread over {workers} workers")
    else:
        width = 0.8 / workers
        for rank in range(workers):
            xs = [i + (rank - (workers - 1) / 2) * width for i in range(len(done))]
            values = [(s["compute_proportion_per_worker"][rank:rank + 1] or [None])[0] or 0.0
                      for s, _ in done]
            ax.bar(xs, values, width=width, label=f"worker {rank}")
        ax.set_title("Time computing / wall time, per worker")
        ax.legend(fontsize="small", ncol=min(workers, 4))
    ax.set_xticks(range(len(done)), [n for _, n in done], rotation=20, ha="right")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("compute proportion")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_sweep(summaries: list[dict[str, Any]], baseline: str, path: Path) -> Path:
    """Time to target, speedup and compute proportion against the swept value, one line per
    run of the recipe, with the 95% interval over repeats as error bars (clipped at 0, and
    a compute proportion's at 1, as the table's intervals are). A speedup over a
    baseline that never reached the target is a lower bound (the table's ``>=``): a ``^``
    instead of a dot. A point over only k of a run's n repeats (the others did not reach
    the target, or failed) is labelled ``k/n``, as the table's cell is."""
    plt = pyplot()
    runs = groups(summaries)
    key = next(iter(runs[0][0]["sweep"]))
    integer = all(isinstance(s["sweep"][key], int) for s in summaries)
    numeric = all(isinstance(s["sweep"][key], int | float) for s in summaries)
    # other values (lists, tables, words) stand side by side in the recipe's order
    shown = list(dict.fromkeys(json.dumps(s["sweep"][key]) for s in summaries))
    bases = {sweep_suffix(g[0]["sweep"]): g for g in runs if is_baseline(g[0], baseline)}
    lines: dict[str, list[tuple[float, tuple[list[float], list[float], list[float]],
                                int]]] = {}
    bounded: set[tuple[str, float]] = set()  # (run, swept value) whose speedup is a bound
    for group in runs:
        first = group[0]
        name = unswept_name(first["run"], first["sweep"])
        done = [s for s in group if "error" not in s]
        speedups, bound = paired_speedups(done, bases.get(sweep_suffix(first["sweep"]), []))
        value = (float(first["sweep"][key]) if numeric
                 else float(shown.index(json.dumps(first["sweep"][key]))))
        if bound and speedups:
            bounded.add((name, value))
        lines.setdefault(name, []).append((value, (
            [s["time_to_target_s"] for s in done if s.get("time_to_target_s") is not None],
            speedups, [s["compute_proportion"] for s in done
                       if s.get("compute_proportion") is not None]), len(group)))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    titles = ("time to target (s)", f"speedup vs {baseline}", "compute proportion")
    for name, points in lines.items():
        points.sort(key=lambda point: point[0])
        for panel, (ax, title) in enumerate(zip(axes, titles, strict=True)):
            xs, ys, below, above = [], [], [], []
            for value, panels, repeats in points:  # a point without a value breaks the line
                mean = interval(panels[panel])[0] if panels[panel] else math.nan
                # the interval clipped at 0 (and a proportion at 1), as the table's
                ends = interval_ends(panels[panel], 1.0 if panel == 2 else None)
                xs.append(value)
                ys.append(mean)
                below.append(0.0 if ends is None else mean - ends[1])
                above.append(0.0 if ends is None else ends[2] - mean)
                if 0 < len(panels[panel]) < repeats:  # as the table's (k/n)
                    ax.annotate(f"{len(panels[panel])}/{repeats}", (value, mean),
                                xytext=(4, 4), textcoords="offset points", fontsize="small")
            speedup = panel == 1
            drawn = ax.errorbar(xs, ys, yerr=[below, above], marker="none" if speedup else "o",
                                capsize=3, label=name)
            if speedup:  # a dot where the speedup is exact, a ^ where it is a lower bound
                color = drawn.lines[0].get_color()
                for marker, keep in (("o", False), ("^", True)):
                    at = [(x, y) for x, y in zip(xs, ys, strict=True)
                          if ((name, x) in bounded) == keep and not math.isnan(y)]
                    if at:
                        ax.plot(*zip(*at, strict=True), marker=marker, linestyle="none",
                                color=color)
            ax.set_title(title)
            ax.set_xlabel(key)
            if integer:
                ax.set_xticks(sorted({v for v, *_ in points}))
            elif not numeric:
                ax.set_xticks(range(len(shown)), shown, fontsize="small")
            ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    if bounded:
        axes[1].legend([plt.Line2D([], [], marker="^", linestyle="none", color="grey")],
                       ["lower bound: the baseline never reached the target"],
                       fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_plots(run_dirs: list[Path], summaries: list[dict[str, Any]], out: Path,
                baseline: str = "") -> list[Path]:
    """All plots of these runs into `out`; returns the files written. With repeats, the
    accuracy and time-to-target plots show them all; compute proportions and timelines show
    the first. Runs never evaluated (timing-only runs) get no accuracy plot, runs without a
    target accuracy no time-to-target plot. Failed runs (an ``error``, no figures) are
    only in the time-to-target chart, marked ``failed``, as the table has them. A sweep of
    one value gets no sweep plot (a line of one point, on an axis of nothing)."""
    mixed = len({s.get("recipe") for s in summaries}) > 1
    every = [label(s) if mixed else s["run"] for s in summaries]
    if targets(summaries):
        path = out / "time_to_target.png"
        written = [plot_time_to_target(summaries, path, every).path]
    else:
        written = []
    ran = [i for i, s in enumerate(summaries) if "error" not in s]
    run_dirs = [run_dirs[i] for i in ran]
    names = [every[i] for i in ran]
    summaries = [summaries[i] for i in ran]
    first = [i for i, s in enumerate(summaries) if s.get("repeat", 0) == 0]
    if any(_evaluated(s) for s in summaries):
        written.insert(0, plot_accuracy(summaries, out / "accuracy.png", names))
    written.append(plot_compute_proportion([summaries[i] for i in first],
                                           out / "compute_proportion.png",
                                           [names[i] for i in first]))
    for run_dir, name in [(run_dirs[i], names[i]) for i in first]:
        stem = "timeline-" + name.replace("/", "-")
        path = out / f"{stem}.png"
        for k in itertools.count(2):  # never one run's plot over another's
            if path not in written:
                break
            path = out / f"{stem}-{k}.png"
        written.append(plot_timeline(run_dir, path, name, _clock(summaries)))
    points = {json.dumps(s.get("sweep"), sort_keys=True) for s in summaries}
    if baseline and all(s.get("sweep") for s in summaries) and len(points) > 1:
        written.append(plot_sweep(summaries, baseline, out / "sweep.png"))
    return written
