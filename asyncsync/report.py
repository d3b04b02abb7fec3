"""Summaries and comparison tables, computed from a run's log files alone."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from asyncsync.comparison import groups, interval, is_baseline, paired_speedups, speedup
from asyncsync.runlogs import label, read_jsonl, sweep_suffix

SMOOTHING = 3
"""Evaluations in the moving average of `time_to_target_avg_s`."""


def summarize_run(run_dir: Path) -> dict[str, Any]:
    """Build ``summary.json``'s fields from ``recipe.json``, ``events.jsonl`` and workers' logs."""
    recipe = json.loads((run_dir / "recipe.json").read_text())
    spec = recipe["runs"][0]
    events = read_jsonl(run_dir / "events.jsonl")
    evals = [e for e in events if e.get("event") == "eval"]
    stop = next((e for e in events if e.get("event") == "stop"), {})
    target = spec["stop"]["target_accuracy"]
    finals = {}
    for path in sorted(run_dir.glob("worker-*.jsonl")):
        rank = int(path.stem.split("-")[1])
        final = [r for r in read_jsonl(path) if r.get("ev") == "final"]
        if final:
            finals[rank] = final[-1]
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
    return {
        "recipe": recipe["name"],
        "run": spec["name"],
        "protocol": spec["protocol"]["name"],
        "workers": spec["workers"],
        "repeat": recipe.get("repeat", 0),
        "seed": spec.get("seed", 0),
        "sweep": spec.get("sweep") or {},
        "wall_s": wall,
        "target_accuracy": target,
        "time_to_target_s": reached,
        "time_to_target_avg_s": steady,
        "best_accuracy": max((e["accuracy"] for e in evals), default=None),
        "final_accuracy": evals[-1]["accuracy"] if evals else None,
        "compute_proportion": round(sum(known) / len(known), 4) if known else None,
        "compute_proportion_per_worker": per_worker,
        "samples_per_s": round(samples / wall, 2) if wall > 0 else None,
        "steps": sum(f["steps"] for f in finals.values()),
        "bytes_up": sum(f["bytes_up"] for f in finals.values()),
        "bytes_down": sum(f["bytes_down"] for f in finals.values()),
        "versions": stop.get("versions"),
        "mean_staleness": stop.get("mean_staleness"),
        "max_staleness": stop.get("max_staleness"),
        "evaluations": [[e["t"], e["accuracy"]] for e in evals],
    }


def _speedup_text(value: float | None, lower_bound: bool) -> str:
    return (">=" if lower_bound else "") + _fmt(value, ".2f", "x")


def _fmt(value: Any, spec: str = ".3f", suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:{spec}}{suffix}"


def _values(group: list[dict[str, Any]], key: str) -> list[float]:
    return [float(s[key]) for s in group if s.get(key) is not None]


def _mean_text(values: list[float], spec: str, total: int, suffix: str = "") -> str:
    """``mean±half-width`` of `values`, with ``(k/n)`` when only k of n repeats have one."""
    if not values:
        return "-"
    mean, half = interval(values)
    text = _fmt(mean, spec, suffix) + ("" if half is None else "±" + _fmt(half, spec))
    return text if len(values) == total else f"{text} ({len(values)}/{total})"


def comparison_table(summaries: list[dict[str, Any]], baseline: str, title: str = "") -> Table:
    """Time to target, best accuracy, speedup vs `baseline`, compute proportion, throughput;
    with repeats, one row per run: the mean and its 95% interval over the repeats."""
    runs = groups(summaries)
    bases = {sweep_suffix(g[0].get("sweep") or {}): g for g in runs if is_baseline(g[0], baseline)}
    target = next((s.get("target_accuracy") for s in summaries if s.get("target_accuracy")),
                  None)
    mixed = len({s.get("recipe") for s in summaries}) > 1
    repeats = max(len(g) for g in runs)
    caption = f" - mean±95% interval over {repeats} repeats" if repeats > 1 else ""
    table = Table(title=f"{title}: comparison (baseline {baseline}){caption}"
                  if title else None)
    for column in ("run", "protocol", f"t->{_fmt(target, '.2f')} (s)", "avg3 (s)", "best acc",
                   "final acc", "speedup", "compute", "samples/s", "MB moved",
                   "staleness", "versions"):
        table.add_column(column, justify="left" if column in ("run", "protocol") else "right")
    for group in runs:
        first = group[0]
        name = label(first) if mixed else first["run"]
        done = [s for s in group if "error" not in s]
        if not done:
            table.add_row(name, first["protocol"], f"[red]failed: {first['error']}[/red]")
            continue
        n = len(group)
        speedups, bound = paired_speedups(
            done, bases.get(sweep_suffix(first.get("sweep") or {}), []))
        moved = [(s["bytes_up"] + s["bytes_down"]) / 1e6 for s in done]
        table.add_row(
            name, first["protocol"], _mean_text(_values(done, "time_to_target_s"), ".1f", n),
            _mean_text(_values(done, "time_to_target_avg_s"), ".1f", n),
            _mean_text(_values(done, "best_accuracy"), ".3f", n),
            _mean_text(_values(done, "final_accuracy"), ".3f", n),
            (">=" if bound else "") + _mean_text(speedups, ".2f", n, "x") if speedups else "-",
            _mean_text(_values(done, "compute_proportion"), ".2f", n),
            _mean_text(_values(done, "samples_per_s"), ".0f", n),
            _mean_text(moved, ".0f", n), _mean_text(_values(done, "mean_staleness"), ".2f", n),
            _mean_text(_values(done, "versions"), ".0f", n))
    return table


def find_runs(dirs: list[Path]) -> list[Path]:
    """Run directories (holding events.jsonl and recipe.json) at or under `dirs`: a recipe,
    a timestamp or a run directory each."""
    found: list[Path] = []
    for root in dirs:
        runs = [e.parent for e in root.rglob("events.jsonl") if (e.parent / "recipe.json").exists()]
        found += sorted((r for r in runs if r not in found), key=_recipe_order)
    return found


def _recipe_order(run_dir: Path) -> tuple[str, int, str]:
    """Runs of one timestamp in their recipe's order, then by name."""
    path = run_dir.parent / "recipe.json"
    names = [r.get("name") for r in json.loads(path.read_text()).get("runs", [])] \
        if path.exists() else []
    index = names.index(run_dir.name) if run_dir.name in names else len(names)
    return str(run_dir.parent), index, run_dir.name


CSV_FIELDS = ("recipe", "run", "repeat", "seed", "protocol", "workers", "wall_s",
              "target_accuracy", "time_to_target_s", "time_to_target_avg_s", "speedup",
              "speedup_is_lower_bound", "best_accuracy", "final_accuracy",
              "compute_proportion", "samples_per_s", "bytes_up", "bytes_down", "versions",
              "mean_staleness", "max_staleness")


def write_csv(summaries: list[dict[str, Any]], baseline: str, path: Path) -> Path:
    """The comparison as CSV: one row per run and repeat (speedups against the baseline's
    repeat with the same index); failed runs keep their error."""
    base = {(sweep_suffix(s.get("sweep") or {}), s.get("repeat", 0)): s for s in summaries
            if is_baseline(s, baseline)}
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=[*CSV_FIELDS, "error"])
        writer.writeheader()
        for s in summaries:
            row = {k: s.get(k) for k in CSV_FIELDS}
            row["speedup"], row["speedup_is_lower_bound"] = speedup(s, base.get(
                (sweep_suffix(s.get("sweep") or {}), s.get("repeat", 0))))
            row["error"] = s.get("error")
            writer.writerow(row)
    return path


def make_console() -> Console:
    """A console that does not squeeze tables when output goes to a file or pipe."""
    console = Console()
    if not console.is_terminal:
        console.width = max(console.width, 150)
    return console


def publish(run_dirs: list[Path], summaries: list[dict[str, Any]], baseline: str, out: Path,
            console: Console, title: str = "") -> list[Path]:
    """Print the comparison table; write it as CSV and, with matplotlib, the PNG plots."""
    from asyncsync.plots import matplotlib_available, write_plots

    console.print(comparison_table(summaries, baseline, title))
    out.mkdir(parents=True, exist_ok=True)
    files = [write_csv(summaries, baseline, out / "table.csv")]
    done = [(d, s) for d, s in zip(run_dirs, summaries, strict=True) if "error" not in s]
    if not matplotlib_available():
        console.print('plots skipped: matplotlib is not installed (pip install -e ".[plot]")',
                      markup=False)
    elif done:
        files += write_plots([d for d, _ in done], [s for _, s in done], out, baseline)
    for path in files:
        console.print(f"wrote {path}", highlight=False)
    return files


def recipe_baseline(run_dir: Path) -> str | None:
    """The baseline named by the whole recipe written next to a run (its parent's)."""
    path = run_dir.parent / "recipe.json"
    if not path.exists():
        return None
    baseline = json.loads(path.read_text()).get("baseline")
    return baseline if isinstance(baseline, str) else None
