"""Virtual time at scale: how many workers one process simulates, and what it costs.

- 256 workers of the mlp on the synthetic task (real torch math per step), bsp and asp,
  ``base_step_s = 0.05``, 30 virtual seconds, lr 0.01 (at the default 0.05, asp's
  gradients, 255 versions stale on average, diverge and a worker's non-finite push
  fails the run).
- Timing-only mode (``model.name = "timing"``) with a 47 MB model, bsp and asp, from 1,000
  workers upward (``--timing-workers``), 60 virtual seconds, 1 Gbit/s links, slowdowns
  1 / 1 / 2 / 4 repeated over the ranks.

Each configuration runs in a child process of its own, so its peak resident memory
(``ru_maxrss``) is its own; the baseline line is a child that imports the same modules and
simulates nothing. Prints real seconds, virtual seconds per real one, versions, steps and
peak memory; the issue's target is each within 10 minutes of real time on 2 cores.

Run: ``.venv/bin/python bench/virtual_scale.py [--timing-workers 1000 2000 5000]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import tempfile
from pathlib import Path
from typing import Any

RECIPE = """
name = "bench-scale"
[defaults]
workers = {workers}
clock = "virtual"
[defaults.stop]
time_s = {virtual_s}
[defaults.model]
{model}
[defaults.optim]
lr = 0.01
[defaults.eval]
interval_s = 5
[defaults.compute]
base_step_s = {base_step_s}
slowdown = {slowdown}
{network}
[[runs]]
name = "bsp"
protocol = "bsp"
[[runs]]
name = "asp"
protocol = "asp"
"""


def recipe(workers: int, timing: bool) -> str:
    if timing:
        return RECIPE.format(
            workers=workers, virtual_s=60, model='name = "timing"\nsize_mb = 47',
            base_step_s=0.1, slowdown=[1, 1, 2, 4] * (workers // 4),
            network="[defaults.network]\nbandwidth_mbps = 1000")
    return RECIPE.format(workers=workers, virtual_s=30, model='name = "mlp"', base_step_s=0.05,
                         slowdown=[], network="")


def child(text: str, run: str, out: Any) -> None:
    """Simulate one run of `text` (or nothing, for ``run == ""``); report facts and peak RSS."""
    from asyncsync.logschema import KEY, Kind
    from asyncsync.recipe import load_recipe
    from asyncsync.runlogs import read_jsonl
    from asyncsync.simulation import simulate

    facts: dict[str, Any] = {}
    if run:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "bench.toml"
            path.write_text(text)
            spec = load_recipe(path).run(run)
            run_dir = Path(tmp) / run
            run_dir.mkdir()
            facts = simulate(spec, run_dir, "bench")
            events = read_jsonl(run_dir / "events.jsonl")
            stop = next(e for e in events if e[KEY] == Kind.STOP)
            facts["versions"] = stop["versions"]
            facts["steps"] = sum(r["steps"] for f in run_dir.glob("worker-*.jsonl")
                                 for r in read_jsonl(f) if r[KEY] == Kind.FINAL)
    facts["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out.put(facts)


def measure(text: str, run: str) -> dict[str, Any]:
    context = mp.get_context("spawn")
    out = context.Queue()
    process = context.Process(target=child, args=(text, run, out))
    process.start()
    facts: dict[str, Any] = out.get()
    process.join()
    return facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mlp-workers", type=int, default=256)
    parser.add_argument("--timing-workers", type=int, nargs="*", default=[1000])
    parser.add_argument("--skip-mlp", action="store_true")
    args = parser.parse_args()
    base = measure("", "")["peak_mb"]
    print(f"baseline: a child that imports and simulates nothing peaks at {base:.0f} MB")
    configs = [] if args.skip_mlp else [(args.mlp_workers, False)]
    configs += [(n, True) for n in args.timing_workers]
    for workers, timing in configs:
        for run in ("bsp", "asp"):
            f = measure(recipe(workers, timing), run)
            kind = "timing 47 MB, 60" if timing else "mlp, 30"
            print(f"{workers:>6} workers {run} ({kind} virtual s): real {f['real_s']:.1f} s, "
                  f"{f['virtual_per_real']:.3g} virtual s per real s, {f['versions']} versions, "
                  f"{f['steps']} steps, {f['steps'] / f['real_s']:.0f} steps per real s, "
                  f"peak {f['peak_mb']:.0f} MB (+{f['peak_mb'] - base:.0f} over baseline)",
                  flush=True)


if __name__ == "__main__":
    main()
