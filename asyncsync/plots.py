"""PNG plots of finished runs, from their logs (needs the `plot` extra: matplotlib).

- ``accuracy.png``: test accuracy of the global model vs wall (or virtual) time, one line
  per run, the target accuracy as a dashed line and each run's time to target as a dot.
- ``compute_proportion.png``: compute proportion per worker, grouped by run.
- ``timeline-<run>.png``: per worker, when it computed, communicated and waited, over a
  window of the run past its start-up.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np

from asyncsync.comparison import groups, interval, is_baseline, paired_speedups
from asyncsync.logschema import HELD, KEY, TRANSFERS, Kind
from asyncsync.runlogs import label, sweep_suffix, worker_logs

COLORS = {"compute": "#2e8b57", "communicate": "#1f77b4", "held": "#ff8c00"}
TIMELINE_CYCLES = 20
"""The timeline shows about this many iterations of the slowest worker, from 20% into the
run (past start-up): enough to see the rhythm, few enough to stay legible."""


def matplotlib_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def repeat_curves(group: list[dict[str, Any]]) -> tuple[Any, Any]:
    """Every repeat's accuracy at all the repeats' evaluation times (one row per repeat).

    A repeat that ended earlier (at its target, with stop_at_target) holds its last
    accuracy, so the mean of repeats that all reached the target reaches the target line.
    """
    times = np.unique(np.concatenate([np.array(s["evaluations"])[:, 0] for s in group]))
    return times, np.array([np.interp(times, *np.array(s["evaluations"]).T) for s in group])


def plot_accuracy(summaries: list[dict[str, Any]], path: Path, names: list[str]) -> Path:
    """Accuracy vs time per run; with repeats, their mean (on the first repeat's evaluation
    times) and a band from the lowest to the highest repeat."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    target = next((s["target_accuracy"] for s in summaries if s.get("target_accuracy")), None)
    runs: dict[str, list[dict[str, Any]]] = {}
    for s, name in zip(summaries, names, strict=True):
        if s.get("evaluations"):
            runs.setdefault(name, []).append(s)
    marked = False
    for name, group in runs.items():
        times, curves = repeat_curves(group)
        (line,) = ax.plot(times, curves.mean(axis=0), linewidth=1.6,
                          label=name if len(group) == 1 else f"{name} ({len(group)} repeats)")
        if len(group) > 1:
            ax.fill_between(times, curves.min(axis=0), curves.max(axis=0),
                            color=line.get_color(), alpha=0.2, linewidth=0)
        reached = [s["time_to_target_s"] for s in group if s.get("time_to_target_s") is not None]
        if reached and target is not None:
            ax.plot(reached, [target] * len(reached), "o", color=line.get_color())
            marked = True
    if marked:  # one legend entry for every run's dots, in no run's colour
        ax.plot([], [], "o", color="grey", label="time to target (a dot per repeat)")
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1,
                   label=f"target {target:g}")
    clock = _clock(summaries)
    ax.set_xlabel(f"{clock} time (s)")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"Accuracy of the global model vs {clock} time")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _clock(summaries: list[dict[str, Any]]) -> str:
    """``virtual`` when every run ran on the virtual clock, else ``wall``."""
    virtual = bool(summaries) and all(s.get("clock") == "virtual" for s in summaries)
    return "virtual" if virtual else "wall"


def plot_compute_proportion(summaries: list[dict[str, Any]], path: Path,
                            names: list[str]) -> Path:
    plt = _pyplot()
    done = [(s, n) for s, n in zip(summaries, names, strict=True) if "error" not in s]
    workers = max((len(s["compute_proportion_per_worker"]) for s, _ in done), default=1)
    width = 0.8 / workers
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(done) + 2), 4.5))
    for rank in range(workers):
        xs = [i + (rank - (workers - 1) / 2) * width for i in range(len(done))]
        values = [(s["compute_proportion_per_worker"][rank:rank + 1] or [None])[0] or 0.0
                  for s, _ in done]
        ax.bar(xs, values, width=width, label=f"worker {rank}")
    ax.set_xticks(range(len(done)), [n for _, n in done], rotation=20, ha="right")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("compute proportion")
    ax.set_title("Time computing / wall time, per worker")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small", ncol=min(workers, 4))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def timeline_window(logs: list[list[dict[str, Any]]]) -> tuple[float, float]:
    """``(start, end)`` of the timeline from the workers' final totals."""
    finals = [r for records in logs for r in records if r.get(KEY) == Kind.FINAL]
    wall = max((f["wall_s"] for f in finals), default=10.0)
    cycle = max((f["wall_s"] / f["steps"] for f in finals if f.get("steps")), default=0.5)
    start = 0.2 * wall
    return start, min(wall, start + max(1.0, TIMELINE_CYCLES * cycle))


def timeline_spans(records: list[dict[str, Any]], window: tuple[float, float]
                   ) -> dict[str, list[tuple[float, float]]]:
    """(start, duration) spans per kind from a worker's log that overlap the window.

    A push transfers then is held for the server's answer; a pull is held (barrier) then
    transfers the model; an exchange (a fused push and pull) uploads, is held, then
    downloads (its transfer time split by bytes).
    """
    spans: dict[str, list[tuple[float, float]]] = {k: [] for k in COLORS}
    for r in records:
        start, dur = r.get("t"), r.get("dur")
        if start is None or dur is None or start > window[1] or start + dur < window[0]:
            continue
        kind = r.get(KEY)
        if kind == Kind.COMPUTE:
            spans["compute"].append((start, dur))
        elif kind in TRANSFERS:
            held = min(r.get(HELD, 0.0), dur)
            transfer = dur - held
            if kind == Kind.EXCHANGE:
                up, down = r.get("up", 0), r.get("down", 0)
                upload = transfer * (up / (up + down) if up + down else 0.5)
                spans["communicate"].append((start, upload))
                spans["held"].append((start + upload, held))
                spans["communicate"].append((start + upload + held, transfer - upload))
            elif kind == Kind.PULL:
                spans["held"].append((start, held))
                spans["communicate"].append((start + held, transfer))
            else:
                spans["communicate"].append((start, transfer))
                spans["held"].append((start + transfer, held))
    return spans


def plot_timeline(run_dir: Path, path: Path, name: str, clock: str = "wall") -> Path:
    """One run's workers over a window of about `TIMELINE_CYCLES` steps of the slowest,
    from 20% into the run (past start-up); `clock` names the x-axis's time."""
    plt = _pyplot()
    logs = worker_logs(run_dir)
    records = list(logs.values())
    window = timeline_window(records)
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(logs) + 1.6))
    for row, worker_records in enumerate(records):
        for kind, spans in timeline_spans(worker_records, window).items():
            if spans:
                ax.broken_barh(spans, (row - 0.35, 0.7), facecolors=COLORS[kind],
                               label=kind if row == 0 else None)
    ax.set_yticks(range(len(logs)), [f"worker {rank}" for rank in logs])
    ax.set_xlim(*window)
    ax.set_xlabel(f"{clock} time (s), a window from 20% into the run: about "
                  f"{TIMELINE_CYCLES} steps of the slowest worker")
    ax.set_title(f"{name}: computing, communicating and held at the server, "
                 f"{window[0]:.1f}-{window[1]:.1f} s")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), fontsize="small", ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_sweep(summaries: list[dict[str, Any]], baseline: str, path: Path) -> Path:
    """Time to target, speedup and compute proportion against the swept value, one line per
    run of the recipe, with the 95% interval over repeats as error bars."""
    plt = _pyplot()
    runs = groups(summaries)
    key = next(iter(runs[0][0]["sweep"]))
    integer = all(isinstance(s["sweep"][key], int) for s in summaries)
    bases = {sweep_suffix(g[0]["sweep"]): g for g in runs if is_baseline(g[0], baseline)}
    lines: dict[str, list[tuple[float, tuple[list[float], list[float], list[float]]]]] = {}
    for group in runs:
        first = group[0]
        name = first["run"].removesuffix(sweep_suffix(first["sweep"]))
        done = [s for s in group if "error" not in s]
        speedups, _ = paired_speedups(done, bases.get(sweep_suffix(first["sweep"]), []))
        lines.setdefault(name, []).append((float(first["sweep"][key]), (
            [s["time_to_target_s"] for s in done if s.get("time_to_target_s") is not None],
            speedups, [s["compute_proportion"] for s in done
                       if s.get("compute_proportion") is not None])))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    titles = ("time to target (s)", f"speedup vs {baseline}", "compute proportion")
    for name, points in lines.items():
        points.sort(key=lambda point: point[0])
        for panel, (ax, title) in enumerate(zip(axes, titles, strict=True)):
            xs, ys, errors = [], [], []
            for value, panels in points:
                if panels[panel]:
                    mean, half = interval(panels[panel])
                    xs.append(value)
                    ys.append(mean)
                    errors.append(half or 0.0)
            ax.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label=name)
            ax.set_title(title)
            ax.set_xlabel(key)
            if integer:
                ax.set_xticks(sorted({v for v, _ in points}))
            ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_plots(run_dirs: list[Path], summaries: list[dict[str, Any]], out: Path,
                baseline: str = "") -> list[Path]:
    """All plots of these runs into `out`; returns the files written. With repeats, the
    accuracy plot shows them all; compute proportions and timelines show the first. Runs
    never evaluated (timing-only runs) get no accuracy plot."""
    mixed = len({s.get("recipe") for s in summaries}) > 1
    names = [label(s) if mixed else s["run"] for s in summaries]
    first = [i for i, s in enumerate(summaries) if s.get("repeat", 0) == 0]
    written = [plot_accuracy(summaries, out / "accuracy.png", names)] if any(
        s.get("evaluations") for s in summaries) else []
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
    if baseline and all(s.get("sweep") for s in summaries):
        written.append(plot_sweep(summaries, baseline, out / "sweep.png"))
    return written
