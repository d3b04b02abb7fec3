"""Summaries and comparison tables, computed from a run's log files alone."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.table import Table


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSONL file; a torn last line (a killed writer) is skipped."""
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def summarize_run(run_dir: Path) -> dict[str, Any]:
    """Build ``summary.json``'s fields from ``recipe.json``, ``events.jsonl`` and workers' logs."""
    spec = json.loads((run_dir / "recipe.json").read_text())["runs"][0]
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
    samples = sum(f["samples"] for f in finals.values())
    return {
        "run": spec["name"],
        "protocol": spec["protocol"]["name"],
        "workers": spec["workers"],
        "wall_s": wall,
        "target_accuracy": target,
        "time_to_target_s": reached,
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


def _fmt(value: Any, spec: str = ".3f", suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:{spec}}{suffix}"


def comparison_table(summaries: list[dict[str, Any]], baseline: str, title: str = "") -> Table:
    """Time to target, best accuracy, speedup vs `baseline`, compute proportion, throughput."""
    base = next((s for s in summaries if s.get("run") == baseline), None)
    base_ttt = base.get("time_to_target_s") if base else None
    target = next((s.get("target_accuracy") for s in summaries if s.get("target_accuracy")),
                  None)
    table = Table(title=f"{title}: comparison (baseline {baseline})" if title else None)
    for column in ("run", "protocol", f"t->{_fmt(target, '.2f')} (s)", "best acc",
                   "final acc", "speedup", "compute", "samples/s", "MB moved",
                   "staleness", "versions"):
        table.add_column(column, justify="left" if column in ("run", "protocol") else "right")
    for s in summaries:
        if "error" in s:
            table.add_row(s["run"], s["protocol"], f"[red]failed: {s['error']}[/red]")
            continue
        ttt = s["time_to_target_s"]
        speedup = base_ttt / ttt if base_ttt and ttt else None
        moved = (s["bytes_up"] + s["bytes_down"]) / 1e6
        table.add_row(
            s["run"], s["protocol"], _fmt(ttt, ".1f"), _fmt(s["best_accuracy"]),
            _fmt(s["final_accuracy"]), _fmt(speedup, ".2f", "x"),
            _fmt(s["compute_proportion"], ".2f"), _fmt(s["samples_per_s"], ".0f"),
            _fmt(moved, ".0f"), _fmt(s["mean_staleness"], ".2f"), _fmt(s["versions"], "d"))
    return table


def find_runs(dirs: list[Path]) -> list[Path]:
    """Run directories under `dirs` (a recipe, a timestamp or a run directory each)."""
    found: list[Path] = []
    for root in dirs:
        candidates = [root] if (root / "recipe.json").exists() else sorted(
            p.parent for p in root.rglob("recipe.json"))
        found += [p for p in candidates if (p / "events.jsonl").exists() and p not in found]
    return found
