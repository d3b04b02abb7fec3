"""Fidelity of virtual time: one recipe in real paced mode and in virtual mode, compared.

4 workers with slowdowns 1, 1, 2, 4 over a 100 Mbit/s link, paced at ``base_step_s``; for
each protocol it prints compute proportion, versions and time to target in both modes,
their differences (targets: proportions within 0.05, versions within 15 %, times to target
within 25 %) and whether the ranking of the protocols by time to target is the same.

Per run and mode it also prints what the worker logs show of the exchanges: the median
time a message spent moving (request time not held at the server) against what the link
model charges (2 x latency + bytes / bandwidth), and the local steps per push of each
worker. Protocols whose rounds end at step boundaries (nbsync: an exchange is adopted at
the first step boundary after it completes) turn a few milliseconds per message into a
whole step per round when the exchange is close to a worker's step time; these lines show
when that happens.

Run: ``.venv/bin/python bench/fidelity.py [--time-s 40] [--only nbsync]
[--set network.latency_ms=1]`` (real mode takes the budget in wall time per protocol; the
host should be otherwise idle).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from asyncsync.recipe import load_recipe
from asyncsync.runner import run_recipe

RECIPE = """
name = "fidelity"
[defaults]
workers = 4
[defaults.stop]
time_s = {time_s}
target_accuracy = 0.5
[defaults.model]
name = "mlp"
[defaults.eval]
interval_s = 1.0
[defaults.compute]
slowdown = [1, 1, 2, 4]
base_step_s = 0.03
[defaults.network]
bandwidth_mbps = 100
latency_ms = 5
[[runs]]
name = "bsp"
protocol = "bsp"
[[runs]]
name = "asp"
protocol = "asp"
[[runs]]
name = "nbsync"
protocol = "nbsync"
[[runs]]
name = "local_sgd"
protocol = {{ name = "local_sgd", local_steps = 8 }}
"""


def exchanges(logs: Path, run: str, latency_ms: float, mbps: float) -> str:
    """What the worker logs of `run` under `logs` show of its messages (see the module
    docstring): median moving time of pushes and of pulls, the link model's charge for a
    push, and each worker's local steps per push."""
    moving: dict[str, list[float]] = {"push": [], "pull": []}
    per_push: list[str] = []
    pushed = 0
    for path in sorted(logs.glob(f"*/*/{run}/worker-*.jsonl")):
        steps = pushes = 0
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["ev"] == "compute":
                steps += record["steps"]
            elif record["ev"] in moving:
                moving[record["ev"]].append(record["dur"] - record["wait"])
                if record["ev"] == "push":
                    pushes += 1
                    pushed = max(pushed, record["up"])
        per_push.append(f"{steps / pushes:.2f}" if pushes else "-")
    if not moving["push"]:
        return "no pushes"
    model_ms = 2 * latency_ms + (pushed * 8 / (mbps * 1e3) if mbps else 0.0)
    pulls = statistics.median(moving["pull"]) * 1e3 if moving["pull"] else float("nan")
    return (f"message moving ms: push {statistics.median(moving['push']) * 1e3:.1f}, "
            f"pull {pulls:.1f} (link model {model_ms:.1f}); "
            f"local steps per push by rank {'/'.join(per_push)}")


def ranking(summaries: list[dict[str, Any]]) -> list[str]:
    """Protocols by time to target (those that never reached it last, by name)."""
    return [s["run"] for s in sorted(summaries, key=lambda s: (
        s["time_to_target_s"] is None, s["time_to_target_s"] or 0.0, s["run"]))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--time-s", type=float, default=40.0)
    parser.add_argument("--only", action="append", default=[], metavar="RUN",
                        help="run only this run (repeatable): bsp, asp, nbsync, local_sgd")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override defaults.KEY in both modes (as asyncsync run --set)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fidelity.toml"
        path.write_text(RECIPE.format(time_s=args.time_s))
        results = {}
        notes = {}
        for clock in ("real", "virtual"):
            recipe = load_recipe(path, [*args.set, f'clock="{clock}"'], args.only)
            results[clock] = asyncio.run(run_recipe(recipe, Path(tmp) / clock, live=False))
            notes[clock] = {spec.name: exchanges(Path(tmp) / clock, spec.name,
                                                 spec.network.link(0).latency_ms,
                                                 spec.network.link(0).uplink_mbps)
                            for spec in recipe.runs}
    print(f"{'run':10} {'compute r/v':>14} {'versions r/v':>16} {'t->0.5 r/v (s)':>18}")
    for real, virtual in zip(results["real"], results["virtual"], strict=True):
        r_cp, v_cp = real["compute_proportion"], virtual["compute_proportion"]
        print(f"{real['run']:10} {r_cp:6.2f}/{v_cp:<6.2f}"
              f"  {real['versions']:7d}/{virtual['versions']:<7d}"
              f"  {real['time_to_target_s']!s:>8}/{virtual['time_to_target_s']!s:<8}")
    for clock, by_run in notes.items():
        for run, note in by_run.items():
            print(f"  {run:10} {clock:7}: {note}")
    worst = max(abs(r["compute_proportion"] - v["compute_proportion"])
                for r, v in zip(results["real"], results["virtual"], strict=True))
    versions = max(abs(r["versions"] - v["versions"]) / max(r["versions"], 1)
                   for r, v in zip(results["real"], results["virtual"], strict=True))
    print(f"largest compute proportion gap {worst:.3f} (target <= 0.05); largest version "
          f"gap {versions:.1%} (target <= 15%)")
    print(f"ranking real {ranking(results['real'])}, virtual {ranking(results['virtual'])}: "
          f"{'same' if ranking(results['real']) == ranking(results['virtual']) else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
