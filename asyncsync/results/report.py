"""Summaries and comparison tables, computed from a run's log files alone."""

from __future__ import annotations

import contextlib
import csv
import itertools
import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from asyncsync.results.comparison import (
    CLIPPED,
    groups,
    is_baseline,
    mean_text,
    paired_speedups,
    speedup,
    targets,
)
from asyncsync.results.layout import make_console as make_console  # (callers of old)
from asyncsync.results.layout import measured, run_block
from asyncsync.results.studies import LogError, identity, resolved_run, written_summary
from asyncsync.runlog.metrics import FLUSH_S
from asyncsync.runlog.reading import (
    DamagedLog,
    final_records,
    label,
    read_jsonl,
    sweep_suffix,
)
from asyncsync.runlog.schema import KEY, Kind

SMOOTHING = 3
"""Evaluations in the moving average of `time_to_target_avg_s`."""

WIDE_BELOW = 3
"""Below this many repeats, the table warns that its 95% intervals are very wide."""

SLIP = 1.5
"""A run's evaluations slipped when two of them lie more than this many intervals apart
(one arrived more than half an interval late): its times to target have a coarser grid."""


def summarize_run(run_dir: Path) -> dict[str, Any]:
    """Build ``summary.json``'s fields from ``recipe.json``, ``events.jsonl`` and workers' logs.

    Raises:
        LogError: recipe.json is missing or not a run's resolved recipe.
    """
    recipe, spec = resolved_run(run_dir)
    events = read_jsonl(run_dir / "events.jsonl")
    evals = [e for e in events if e.get(KEY) == Kind.EVAL]
    stop = next((e for e in events if e.get(KEY) == Kind.STOP), {})
    named = identity(recipe, spec)
    target = named.pop("target_accuracy")  # written after wall_s, as summaries always were
    finals = final_records(run_dir)
    wall = float(stop.get("t", max((e["t"] for e in evals), default=0.0)))
    per_worker = [
        round(finals[r]["compute_s"] / finals[r]["wall_s"], 4) if r in finals
        and finals[r]["wall_s"] > 0 else None
        for r in range(spec["workers"])
    ]
    known = [p for p in per_worker if p is not None]
    reached = next((e["t"] for e in evals if target is not None and e["accuracy"] >= target),
                   None)
    accuracies = [e["accuracy"] for e in evals]
    steady = next((evals[i]["t"] for i in range(SMOOTHING - 1, len(evals))
                   if target is not None
                   and sum(accuracies[i - SMOOTHING + 1 : i + 1]) / SMOOTHING >= target), None)
    samples = sum(f["samples"] for f in finals.values())
    unfinished = [r for r in range(spec["workers"]) if r not in finals]
    killed = [r for r, final in finals.items() if final.get("unfinished_steps")]
    gaps = [b["t"] - a["t"] for a, b in itertools.pairwise(evals)]
    every = (spec.get("eval") or {}).get("interval_s")
    summary = {
        **named,
        "wall_s": wall,
        "target_accuracy": target,
        "time_to_target_s": reached,
        "time_to_target_avg_s": steady,
        "best_accuracy": max(filter(math.isfinite, accuracies), default=None),
        "final_accuracy": _finite(accuracies[-1]) if evals else None,
        "compute_proportion": round(sum(known) / len(known), 4) if known else None,
        "compute_proportion_per_worker": per_worker,
        "samples_per_s": round(samples / wall, 2) if wall > 0 else None,
        "steps": sum(f["steps"] for f in finals.values()),
        "bytes_up": sum(f["bytes_up"] for f in finals.values()),
        "bytes_down": sum(f["bytes_down"] for f in finals.values()),
        "versions": stop.get("versions"),
        "mean_staleness": stop.get("mean_staleness"),
        "max_staleness": stop.get("max_staleness"),
        "eval_interval_s": every,
        "eval_interval_mean_s": round(sum(gaps) / len(gaps), 3) if gaps else None,
        "eval_interval_max_s": round(max(gaps), 3) if gaps else None,
        "eval_slipped": bool(gaps and every and max(gaps) > SLIP * every),
        "evaluations": [[e["t"], _finite(e["accuracy"])] for e in evals],
        **({"gave_up": stop["reason"]} if "reason" in stop else {}),
        **({"dropped": stop["dropped"]} if "dropped" in stop else {}),
        **({"workers_without_final": unfinished} if unfinished else {}),
        **({"workers_killed": killed} if killed else {}),
    }
    for column in COLUMNS:
        if column.derive is not None:
            summary[column.key] = column.derive(summary)
    return summary


def _finite(accuracy: float) -> float | None:
    """An evaluation's accuracy, None where it is not a number (a custom evaluator's 0/0):
    no best, final or point of it; summary.json stays JSON (it has no NaN)."""
    return accuracy if math.isfinite(accuracy) else None


def report_summary(run_dir: Path) -> dict[str, Any]:
    """A finished run's summary for the report: a failed run's summary.json (its error,
    as `asyncsync run` tabled it), else rebuilt from its logs by `summarize_run`.

    A run whose log has a damaged line, a record of the wrong shape (a field missing or
    of another type), or no stop record (its events.jsonl cut), is reported failed, its
    error naming the file (and line), as a run that failed is: the other runs are still
    tabled, and the damaged one is marked and named in the table and table.csv, not left
    out unseen.

    Raises:
        LogError: recipe.json is missing or not a run's resolved recipe (the run cannot be
            named in a row).
    """
    written = written_summary(run_dir)
    if "error" in written:  # its name as `identity` writes it, also in an old study
        named = identity(*resolved_run(run_dir))
        return {**named, **written, "run": named["run"]}
    try:
        summary = summarize_run(run_dir)
        if summary["versions"] is None:  # every run's server writes it last: the log was cut
            raise DamagedLog(f"{run_dir / 'events.jsonl'}: no stop record, though its "
                             "summary.json says the run finished (the log was cut)")
        return summary
    except DamagedLog as exc:
        return {**identity(*resolved_run(run_dir)), "error": f"damaged log: {exc}"}
    except (KeyError, TypeError, ValueError) as exc:  # a record that parses, misshapen
        return {**identity(*resolved_run(run_dir)), "error": (
            f"damaged log: {run_dir}: a record is not as asyncsync writes it "
            f"({type(exc).__name__}: {exc})")}


def with_identity(run_dir: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """A failed run's summary with the `identity` fields it lacks (its target among them)
    from its recipe.json, where that is readable; any other summary as it is."""
    if "error" in summary:
        with contextlib.suppress(LogError):
            return {**identity(*resolved_run(run_dir)), **summary}
    return summary


@dataclass(frozen=True)
class Column:
    """One figure of a run: one entry here puts it in the table, table.csv and summary.json.

    Attributes:
        key: its name in summary.json and table.csv.
        header: the table's short header (``{target}`` becomes the target accuracy).
        legend: what it means, printed under the table.
        spec: format of a value; suffix: appended to it.
        derive: computes it from the summary's other fields (None: summarize_run sets it).
        shown: whether the terminal table shows it (table.csv has every column).
        relative: a ratio against the baseline's repeat of the same seed (the speedup).
        when_any: shown (though not `shown`) when some run of the table has it.
        needs_target: measured against the target accuracy: the terminal table leaves it
            out when no run of it has a target (its every cell would be ``-``).
        most: the largest value it can take (an accuracy, a proportion: 1; None: no
            bound); every figure is at least 0. A 95% interval is clipped to that range.
    """

    key: str
    header: str
    legend: str
    spec: str = ".3f"
    suffix: str = ""
    derive: Callable[[dict[str, Any]], Any] | None = None
    shown: bool = True
    relative: bool = False
    when_any: bool = False
    needs_target: bool = False
    most: float | None = None


def _mb_moved(summary: dict[str, Any]) -> float:
    return round(float(summary["bytes_up"] + summary["bytes_down"]) / 1e6, 3)


COLUMNS = (
    Column("time_to_target_s", "t@{target}", "seconds to the first evaluation >= {target}",
           ".1f", needs_target=True),
    Column("time_to_target_avg_s", "avg3", "seconds until the mean of 3 evaluations >= "
           "{target}", ".1f", needs_target=True),
    Column("best_accuracy", "best", "best test accuracy", most=1.0),
    Column("final_accuracy", "final", "last test accuracy", shown=False, most=1.0),
    Column("speedup", "speedup", "baseline's t@target / this run's (>=: a lower bound)",
           ".2f", "x", relative=True, needs_target=True),
    Column("compute_proportion", "comp", "compute proportion (time computing / wall time)",
           ".2f", most=1.0),
    Column("samples_per_s", "smp/s", "samples per second, all workers", ".0f"),
    Column("mb_moved", "MB", "megabytes pushed and pulled", ".0f", derive=_mb_moved,
           shown=False),
    Column("mean_staleness", "stale", "mean staleness of the applied updates (versions)",
           ".2f"),
    Column("versions", "vers", "model versions", ".0f", shown=False),
    Column("dropped", "drop", "reports dropped by round policies (late for a round that "
           "closed without them; - when none)", ".0f", shown=False, when_any=True),
    Column("eval_interval_mean_s", "eval", "mean seconds between evaluations", ".1f",
           shown=False),
    Column("eval_interval_max_s", "eval max", "longest gap between evaluations", ".1f",
           shown=False),
)
"""The comparison's figures, in table order."""

IDENTITY = ("recipe", "run", "repeat", "seed", "protocol", "workers", "clock", "wall_s",
            "target_accuracy")
"""table.csv's leading fields: which run it is and what it was measured against."""

RAW = ("bytes_up", "bytes_down", "max_staleness", "eval_slipped")
"""summary.json fields table.csv keeps after the columns."""

PART_OF_REPEATS = ("(k/n): over the k of n repeats that have the figure; a time to target "
                   "or a speedup only where the repeat reached the target, so over all n "
                   "the times would be longer")
"""The legend of a figure over part of a run's repeats (`_mean_text`'s ``(k/n)``)."""

SLIP_MARK = "*"
"""Marks a run whose evaluations slipped (see `summarize_run`)."""


def _values(group: list[dict[str, Any]], key: str) -> list[float]:
    return [float(s[key]) for s in group if s.get(key) is not None]


def _cells(summaries: list[dict[str, Any]], baseline: str, columns: list[Column]
           ) -> list[tuple[str, str, list[str] | None, str]]:
    """Per run (repeats together): name, protocol, its cells (None: failed) or the error."""
    runs = groups(summaries)
    bases = {sweep_suffix(g[0].get("sweep") or {}): g for g in runs if is_baseline(g[0], baseline)}
    mixed = len({s.get("recipe") for s in summaries}) > 1
    rows: list[tuple[str, str, list[str] | None, str]] = []
    for group in runs:
        first = group[0]
        name = label(first) if mixed else first["run"]
        done = [s for s in group if "error" not in s]
        if any(s.get("eval_slipped") for s in done):
            name += SLIP_MARK
        if not done:
            rows.append((name, first["protocol"], None, str(first["error"])))
            continue
        cells = []
        for column in columns:
            if column.relative:
                speedups, bound = paired_speedups(
                    done, bases.get(sweep_suffix(first.get("sweep") or {}), []))
                text = mean_text(speedups, column.spec, len(group), column.suffix,
                                  column.most)
                cells.append((">=" if bound and speedups else "") + text)
            else:
                cells.append(mean_text(_values(done, column.key), column.spec, len(group),
                                        column.suffix, column.most))
        rows.append((name, first["protocol"], cells, ""))
    return rows


def comparison_table(summaries: list[dict[str, Any]], baseline: str, title: str = "",
                     width: int | None = None) -> Group:
    """The comparison: one row per run (with repeats, the mean and its 95% interval), short
    headers and a legend; where the table is wider than `width`, one block per run instead,
    so that no number is ever cut."""
    aims = targets(summaries)
    accuracy = aims[0] if aims else None
    target = _target_text(aims[0]) if len(aims) == 1 else "target"
    columns = [c for c in COLUMNS if (c.shown or (
        c.when_any and any(s.get(c.key) is not None for s in summaries))) and not (
        c.needs_target and accuracy is None)]
    headers = [c.header.format(target=target) for c in columns]
    repeats = max(len(g) for g in groups(summaries))
    caption = f" - mean±95% interval over {repeats} repeats" if repeats > 1 else ""
    compared = (f"baseline {baseline}" if any(is_baseline(s, baseline) for s in summaries)
                else f"no baseline: {baseline} did not run")
    heading = f"{title}: comparison ({compared}){caption}" if title else ""
    rows = _cells(summaries, baseline, columns)

    def tabled(errors: bool) -> Table:
        """The table; a failed run's error in full (wrapped in its row where the table is
        too wide), or only ``failed`` (to measure the table without the errors)."""
        table = Table(title=heading or None, box=box.SIMPLE_HEAD, padding=(0, 1),
                      pad_edge=False)
        for index, header in enumerate(("run", "protocol", *headers)):
            table.add_column(header, justify="left" if index < 2 else "right",
                             no_wrap=index != 2, overflow="fold")
        for name, protocol, cells, error in rows:
            failed = f"failed: {error}" if errors else "failed"
            if cells is None:
                table.add_row(name, protocol, Text(failed, style="red", justify="left"))
            else:
                table.add_row(name, protocol, *cells)
        return table

    table = tabled(errors=True)
    legend = [f"{h}: {c.legend.format(target=target)}" for h, c in zip(headers, columns,
                                                                         strict=True)]
    if accuracy is None:
        legend.append("no run set stop.target_accuracy, so no time to a target and no "
                      "speedup")
    if len(aims) > 1:
        legend.append(f"the runs' targets differ ({', '.join(f'{t:g}' for t in aims)}): "
                      "each time is to its own run's target")
    if any(cell.endswith("/" + str(count) + ")") for (_, _, cells, _), count
           in zip(rows, map(len, groups(summaries)), strict=True) for cell in cells or []):
        legend.append(PART_OF_REPEATS)
    if any(" [" in cell for _, _, cells, _ in rows for cell in cells or []):
        legend.append(CLIPPED)
    fewest = min(len(g) for g in groups(summaries))
    if 1 < fewest < WIDE_BELOW:
        legend.append(f"with {fewest} repeats the 95% intervals are very wide (Student's t "
                      f"with {fewest - 1} degree{'s' if fewest > 2 else ''} of freedom): "
                      f"run {WIDE_BELOW} or more for a usable interval")
    legend += [f"{name.removesuffix(SLIP_MARK)}: {count} of {repeats} repeats finished (its "
               f"figures are over {'that one' if count == 1 else 'those'})"
               for (name, *_), count in zip(rows, map(len, groups(summaries)), strict=True)
               if count < repeats]
    legend += [f"{s['run']}: repeat {s.get('repeat', 0)} failed (its figures are over the "
               f"others): {s['error']}" for group in groups(summaries)
               if any("error" not in s for s in group) for s in group if "error" in s]
    if any(name.endswith(SLIP_MARK) for name, *_ in rows):
        legend.append(f"{SLIP_MARK} evaluations slipped (a gap > {SLIP:g} evaluation intervals): "
                      "a coarser grid for its times to target; see eval_interval_* in table.csv")
    legend += [f"{s['run']}: worker{'s' if len(ranks) > 1 else ''} "
               f"{', '.join(map(str, ranks))} left no final record (killed, or the log was "
               "cut): not in its totals, smp/s or comp"
               for s in summaries if (ranks := s.get("workers_without_final"))]
    legend += [f"{s['run']}: worker{'s' if len(ranks) > 1 else ''} "
               f"{', '.join(map(str, ranks))} had a process killed and started again: the "
               f"killed one's steps and samples are counted from its log, less the last "
               f"~{FLUSH_S:g} s it had not yet written (a lower bound); its comp and bytes "
               "are the last process's" for s in summaries if (ranks := s.get("workers_killed"))]
    notes = Text("; ".join(legend) + ". Every column: table.csv.", style="dim")
    if width is None or measured(tabled(errors=False)).maximum <= width:
        return Group(table, notes)  # an error too long for the row wraps in it
    blocks: list[Any] = [Text(heading, style="italic")] if heading else []
    for name, protocol, cells, error in rows:
        failed = [("[red]failed[/red]", Text(error, style="red"))] if cells is None else []
        blocks.append(run_block(name, protocol, failed + [
            (f"  {header}", cell) for header, cell in zip(headers, cells or [], strict=False)],
            justify="right"))
    return Group(*blocks, notes)


def _target_text(accuracy: float) -> str:
    """A target as the headers and legend write it: two decimals (``0.80``), or all of its
    own where it has more (``0.995``, not ``0.99``: the table would claim a lower target)."""
    text = f"{accuracy:.2f}"
    return text if float(text) == accuracy else f"{accuracy:g}"


def write_csv(summaries: list[dict[str, Any]], baseline: str, path: Path) -> Path:
    """The comparison as CSV: one row per run and repeat, every column of `COLUMNS`
    (speedups against the baseline's repeat with the same index); failed runs keep their
    error."""
    base = {(sweep_suffix(s.get("sweep") or {}), s.get("repeat", 0)): s for s in summaries
            if is_baseline(s, baseline)}
    fields = [*IDENTITY]
    for column in COLUMNS:
        fields += [column.key, "speedup_is_lower_bound"] if column.relative else [column.key]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=[*fields, *RAW, "error"])
        writer.writeheader()
        for s in summaries:
            row = {k: s.get(k) for k in (*fields, *RAW, "error")}
            for column in COLUMNS:
                if column.relative:
                    row[column.key], row["speedup_is_lower_bound"] = speedup(s, base.get(
                        (sweep_suffix(s.get("sweep") or {}), s.get("repeat", 0))))
            writer.writerow(row)
    return path


def output_folder(path: Path) -> Path:
    """`path` as a folder that table.csv and the plots can be written into, made if missing:
    checked before a table is printed, so a bad ``--out`` fails alone.

    Raises:
        LogError: `path` is a file, or cannot be made, or written into.
    """
    if path.exists() and not path.is_dir():
        raise LogError(f"{path}: is a file, not a folder: --out takes a folder for table.csv "
                       "and the plots")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LogError(f"{path}: cannot make this folder ({exc.strerror or exc})") from None
    try:  # permissions, a read-only mount, a pseudo filesystem: only a try tells
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise LogError(f"{path}: cannot write into this folder ({exc.strerror or exc})"
                       ) from None
    return path


def preload_plots() -> None:
    """Import what `publish` draws with (matplotlib's pyplot, the plot modules), if
    matplotlib is installed. A study calls it in a thread while its runs go in child
    processes, so the import (0.5-1 s) is not paid after the last run."""
    from asyncsync.results import pyplot

    if pyplot.matplotlib_available():
        import asyncsync.results.plots  # noqa: F401

        pyplot.pyplot()


def publish(run_dirs: list[Path], summaries: list[dict[str, Any]], baseline: str, out: Path,
            console: Console, title: str = "") -> list[Path]:
    """Print the comparison table; write it as CSV and, with matplotlib, the PNG plots.
    Failed runs' summaries get the fields they lack from their recipe.json (`with_identity`):
    the target columns then show where the runs set a target, though none reached it."""
    from asyncsync.results import pyplot
    from asyncsync.results.plots import write_plots

    summaries = [with_identity(d, s) for d, s in zip(run_dirs, summaries, strict=True)]
    output_folder(out)
    console.print(comparison_table(summaries, baseline, title, console.width))
    files = [write_csv(summaries, baseline, out / "table.csv")]
    done = [(d, s) for d, s in zip(run_dirs, summaries, strict=True) if "error" not in s]
    if not pyplot.matplotlib_available():
        console.print('plots skipped: matplotlib is not installed (pip install -e ".[plot]")',
                      markup=False)
    elif done:
        files += write_plots(run_dirs, summaries, out, baseline)
    for path in files:
        console.print(f"wrote {path}", highlight=False, soft_wrap=True)
    return files
