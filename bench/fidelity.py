"""Fidelity of virtual time: one recipe in real paced mode and in virtual mode, compared.

4 workers with slowdowns 1, 1, 2, 4 over a 100 Mbit/s link, paced at ``base_step_s``; for
each protocol it prints compute proportion, versions and time to target in both modes,
their differences (targets: proportions within 0.05, versions within 15 %, times to target
within 25 %) and whether the ranking of the protocols by time to target is the same.

Run: ``.venv/bin/python bench/fidelity.py [--time-s 40]`` (real mode takes the budget in
wall time per protocol; the host should be otherwise idle).
"""

from __future__ import annotations

import argparse
import asyncio
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


def ranking(summaries: list[dict[str, Any]]) -> list[str]:
    """Protocols by time to target (those that never reached it last, by name)."""
    return [s["run"] for s in sorted(summaries, key=lambda s: (
        s["time_to_target_s"] is None, s["time_to_target_s"] or 0.0, s["run"]))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--time-s", type=float, default=40.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fidelity.toml"
        path.write_text(RECIPE.format(time_s=args.time_s))
        results = {}
        for clock in ("real", "virtual"):
            recipe = load_recipe(path, [f'clock="{clock}"'])
            results[clock] = asyncio.run(run_recipe(recipe, Path(tmp) / clock, live=False))
    print(f"{'run':10} {'compute r/v':>14} {'versions r/v':>16} {'t->0.5 r/v (s)':>18}")
    for real, virtual in zip(results["real"], results["virtual"], strict=True):
        r_cp, v_cp = real["compute_proportion"], virtual["compute_proportion"]
        print(f"{real['run']:10} {r_cp:6.2f}/{v_cp:<6.2f}"
              f"  {real['versions']:7d}/{virtual['versions']:<7d}"
              f"  {real['time_to_target_s']!s:>8}/{virtual['time_to_target_s']!s:<8}")
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
