"""``timeline-<run>.png``: per worker (at most `TIMELINE_ROWS` of a larger run), when it
computed, communicated and was held at the server, over a window past the run's start-up."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np

from asyncsync.results.pyplot import pyplot
from asyncsync.runlog.reading import line_rank, worker_logs, worker_records
from asyncsync.runlog.schema import HELD, KEY, TRANSFERS, Kind

COLORS = {"compute": "#2e8b57", "communicate": "#1f77b4", "held": "#ff8c00"}
TIMELINE_CYCLES = 20
"""The timeline shows about this many iterations of the slowest worker, from 20% into the
run (past start-up): enough to see the rhythm, few enough to stay legible."""
TIMELINE_ROWS = 32
"""The most workers a timeline draws: a larger run shows this many, spread evenly over its
workers ranked by compute proportion, so the slowest, the fastest and those between show."""


def timeline_window(finals: Collection[dict[str, Any]]) -> tuple[float, float]:
    """``(start, end)`` of the timeline from the workers' final totals."""
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


def timeline_ranks(ranks: Collection[int], finals: dict[int, dict[str, Any]]) -> list[int]:
    """The ranks a timeline draws, in rank order: all of `ranks`, or `TIMELINE_ROWS` spread
    evenly over them sorted by compute proportion (from `finals`; ends included)."""
    if len(ranks) <= TIMELINE_ROWS:
        return sorted(ranks)

    def busy(rank: int) -> float:
        final = finals.get(rank)
        return final["compute_s"] / final["wall_s"] if final and final["wall_s"] > 0 else 0.0

    ranked = sorted(ranks, key=lambda rank: (busy(rank), rank))
    picks = np.linspace(0, len(ranked) - 1, TIMELINE_ROWS).round().astype(int)
    return sorted({ranked[i] for i in picks})


def plot_timeline(run_dir: Path, path: Path, name: str, clock: str = "wall") -> Path:
    """One run's workers (at most `TIMELINE_ROWS`, see `timeline_ranks`) over a window of
    about `TIMELINE_CYCLES` steps of the slowest, from 20% into the run (past start-up);
    `clock` names the x-axis's time."""
    plt = pyplot()
    seen: set[int] = set()
    finals: dict[int, dict[str, Any]] = {}

    def final_or_unknown(line: str) -> bool:  # a shared log's other lines: rank noted only
        rank = line_rank(line)
        if rank is not None:
            seen.add(rank)
        return rank is None or Kind.FINAL in line

    for rank, record in worker_records(run_dir, final_or_unknown):  # only drawn ranks kept
        seen.add(rank)
        if record.get(KEY) == Kind.FINAL:
            finals[rank] = record
    window = timeline_window(list(finals.values()))
    ranks = timeline_ranks(seen, finals)
    logs = worker_logs(run_dir, set(ranks))
    height = (0.6 if len(ranks) <= 8 else 0.3) * len(ranks) + 1.6
    fig, ax = plt.subplots(figsize=(10, height))
    for row, rank in enumerate(ranks):
        for kind, spans in timeline_spans(logs.get(rank, []), window).items():
            if spans:
                ax.broken_barh(spans, (row - 0.35, 0.7), facecolors=COLORS[kind])
    shown = "" if len(ranks) == len(seen) else (
        f" ({len(ranks)} of {len(seen)} workers, from the least to the most busy)")
    ax.set_yticks(range(len(ranks)), [f"worker {rank}" for rank in ranks])
    ax.set_ylim(-0.6, len(ranks) - 0.4)
    ax.set_xlim(*window)
    ax.set_xlabel(f"{clock} time (s), a window from 20% into the run: about "
                  f"{TIMELINE_CYCLES} steps of the slowest worker")
    ax.set_title(f"{name}: computing, communicating and held at the server, "
                 f"{window[0]:.1f}-{window[1]:.1f} s{shown}", fontsize="medium")
    kinds = [plt.Rectangle((0, 0), 1, 1, color=color) for color in COLORS.values()]
    fig.legend(kinds, list(COLORS), loc="lower center", fontsize="small", ncol=3)
    fig.tight_layout(rect=(0, 0.35 / height, 1, 1))  # the legend's 0.35 in at the bottom
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
