"""Virtual time at scale: how many workers one process simulates, and what it costs.

- 256 workers of the mlp on the synthetic task (real torch math per step), bsp and asp,
  ``base_step_s = 0.05``, 30 virtual seconds, lr 0.01 (asp's gradients are 255 versions
  stale on average: some pushes still come out non-finite, and are refused and counted).
- Timing-only mode (``model.name = "timing"``) with a 47 MB model, bsp and asp, at 100 and
  1,000 workers (``--timing-workers``), 60 virtual seconds, 1 Gbit/s links, slowdowns
  1 / 1 / 2 / 4 repeated over the ranks.

Each configuration runs in a child process of its own, so its peak resident memory
(``ru_maxrss``) is its own; the baseline line is a child that imports the same modules and
simulates nothing. Prints real seconds, virtual seconds per real one, versions, steps,
simulated exchanges (a worker's request that moves a model: push, pull or fused exchange)
per real second and the host's microseconds per exchange (both over the run, its set-up
left out: building 100,000 workers takes minutes of its own), their ratio to the smallest
worker count of the same protocol (issue 23: within 1.5x from 100 to 10,000 workers),
and peak memory over the baseline, in all and per worker. ``--runs bsp asp ssp`` adds
ssp (staleness 3), whose slowest live clock is kept incrementally.

``--cli`` also runs each configuration as a user does, ``asyncsync run RECIPE --only RUN``
(default ``--jobs``, plain output, its table, CSV and plots), and prints its wall and CPU
seconds (the command's processes together) against the engine's: the child above, from
its start (imports included) to the end of `simulate`, and their ratio (issue 45: at most
1.15x at 10,000 timing workers).

Run: ``.venv/bin/python bench/virtual_scale.py [--timing-workers 100 1000 10000] [--cli]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import subprocess
import sys
import tempfile
import time
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
[[runs]]
name = "ssp"
protocol = "ssp"
"""


def recipe(workers: int, timing: bool, virtual_s: float) -> str:
    if timing:
        return RECIPE.format(
            workers=workers, virtual_s=virtual_s, model='name = "timing"\nsize_mb = 47',
            base_step_s=0.1, slowdown=[1, 1, 2, 4] * (workers // 4),
            network="[defaults.network]\nbandwidth_mbps = 1000")
    return RECIPE.format(workers=workers, virtual_s=virtual_s, model='name = "mlp"',
                         base_step_s=0.05, slowdown=[], network="")


def child(text: str, run: str, out: Any) -> None:
    """Simulate one run of `text` (or nothing, for ``run == ""``); report facts and peak RSS,
    and the wall and CPU seconds from this function's start to the end of the simulation."""
    began = time.perf_counter()
    from asyncsync.runlog.reading import iter_jsonl, worker_records
    from asyncsync.runlog.schema import KEY, TRANSFERS, Kind
    from asyncsync.study.recipe import load_recipe
    from asyncsync.study.simulation import simulate

    facts: dict[str, Any] = {}
    if run:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "bench.toml"
            path.write_text(text)
            spec = load_recipe(path).run(run)
            run_dir = Path(tmp) / run
            run_dir.mkdir()
            facts = simulate(spec, run_dir, "bench")
            facts["engine_wall_s"] = time.perf_counter() - began
            facts["engine_cpu_s"] = cpu_s(resource.RUSAGE_SELF)
            # The simulation's peak, before this function reads the logs (millions of
            # records at 10,000 workers: reading them all at once was most of the peak).
            facts["peak_mb"] = peak_mb()
            stop = next(e for e in iter_jsonl(run_dir / "events.jsonl") if e[KEY] == Kind.STOP)
            facts["versions"] = stop["versions"]
            facts["steps"] = facts["exchanges"] = 0
            for _, record in worker_records(run_dir):
                facts["steps"] += record["steps"] if record[KEY] == Kind.FINAL else 0
                facts["exchanges"] += record[KEY] in TRANSFERS
    else:
        facts["peak_mb"] = peak_mb()
    out.put(facts)


def cpu_s(who: int) -> float:
    """User and system CPU seconds of this process (or of its waited-for children)."""
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def run_cli(text: str, run: str) -> tuple[float, float]:
    """Wall and CPU seconds of ``asyncsync run`` on `text`, only `run`, as a user runs it."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.toml"
        path.write_text(text)
        cpu_before = cpu_s(resource.RUSAGE_CHILDREN)
        began = time.perf_counter()
        subprocess.run([sys.executable, "-m", "asyncsync", "run", str(path), "--only", run,
                        "--plain", "--logs", str(Path(tmp) / "logs")], check=True,
                       stdout=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "100"})
        return time.perf_counter() - began, cpu_s(resource.RUSAGE_CHILDREN) - cpu_before


def peak_mb() -> float:
    """This process's peak resident memory so far, in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


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
    parser.add_argument("--mlp-virtual-s", type=float, default=30)
    parser.add_argument("--timing-workers", type=int, nargs="*", default=[100, 1000])
    parser.add_argument("--timing-virtual-s", type=float, default=60)
    parser.add_argument("--runs", nargs="*", default=["bsp", "asp"],
                        choices=["bsp", "asp", "ssp"])
    parser.add_argument("--skip-mlp", action="store_true")
    parser.add_argument("--cli", action="store_true",
                        help="also time asyncsync run on each configuration (see above)")
    args = parser.parse_args()
    base = measure("", "")["peak_mb"]
    print(f"baseline: a child that imports and simulates nothing peaks at {base:.0f} MB")
    configs = [] if args.skip_mlp else [(args.mlp_workers, False, args.mlp_virtual_s)]
    configs += [(n, True, args.timing_virtual_s) for n in sorted(args.timing_workers)]
    smallest: dict[tuple[bool, str], float] = {}
    for workers, timing, virtual_s in configs:
        for run in args.runs:
            f = measure(recipe(workers, timing, virtual_s), run)
            kind = f"timing 47 MB, {virtual_s:g}" if timing else f"mlp, {virtual_s:g}"
            running_s = f["real_s"] - f["setup_real_s"]  # the run, its set-up left out
            per_exchange = running_s / max(f["exchanges"], 1) * 1e6
            first = smallest.setdefault((timing, run), per_exchange)
            extra = f["peak_mb"] - base
            print(f"{workers:>6} workers {run} ({kind} virtual s): real {f['real_s']:.1f} s "
                  f"(set-up {f['setup_real_s']:.1f} s), "
                  f"{f['virtual_per_real']:.3g} virtual s per real s, {f['versions']} versions, "
                  f"{f['steps']} steps, {f['exchanges']} exchanges, "
                  f"{f['exchanges'] / running_s:.0f} exchanges per real s, "
                  f"{per_exchange:.0f} us per exchange ({per_exchange / first:.2f}x the "
                  f"smallest run's), peak {f['peak_mb']:.0f} MB (+{extra:.0f} over baseline, "
                  f"{extra * 1024 / workers:.0f} kB per worker)", flush=True)
            if args.cli:
                wall_s, cpu = run_cli(recipe(workers, timing, virtual_s), run)
                print(f"{workers:>6} workers {run}: asyncsync run {wall_s:.1f} s wall, "
                      f"{cpu:.1f} s CPU; the engine {f['engine_wall_s']:.1f} s wall, "
                      f"{f['engine_cpu_s']:.1f} s CPU; asyncsync run / engine: "
                      f"{wall_s / f['engine_wall_s']:.2f}x wall, "
                      f"{cpu / f['engine_cpu_s']:.2f}x CPU", flush=True)


if __name__ == "__main__":
    main()
