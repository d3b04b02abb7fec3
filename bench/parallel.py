"""A study with --jobs 1 and with --jobs N on this host: wall time of each, the speedup, and
whether the two studies wrote the same results.

Runs ``recipes/at_scale/wbsp.toml`` (mlp, virtual clock; 4 protocols x 3 sweep values x
--repeats). Results are the same when every run's logs and summary.json (less the fields
measured on the host's clock) and table.csv are byte for byte equal. Target: >= 1.8x with
--jobs 2 on 2 idle cores; the load average before and after is printed, as a busy host
gives less.

    .venv/bin/python bench/parallel.py              # 12 runs (--repeats 1), a few minutes
    .venv/bin/python bench/parallel.py --repeats 5  # the recipe's 60 runs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from asyncsync.study.simulation import REAL_TIME_FIELDS

ROOT = Path(__file__).parent.parent
RECIPE = ROOT / "recipes" / "at_scale" / "wbsp.toml"


def study(logs: Path, jobs: int, args: argparse.Namespace) -> float:
    """Run the study with `jobs`; returns its wall time in seconds."""
    only = [f"--only={name}" for name in args.only]
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "asyncsync", "run", str(RECIPE), "--plain",
                           "--logs", str(logs), "--jobs", str(jobs), "--repeats",
                           str(args.repeats), *only], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"--jobs {jobs} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return time.perf_counter() - began


def results(logs: Path) -> dict[str, bytes | dict[str, object]]:
    """Every deterministic file of the one study under `logs`."""
    (root,) = (logs / "at_scale_wbsp").iterdir()
    files: dict[str, bytes | dict[str, object]] = {"table.csv": (root / "table.csv").read_bytes()}
    for run_dir in sorted(d for d in root.iterdir() if (d / "recipe.json").exists()):
        for path in sorted(run_dir.glob("*.jsonl")):
            files[f"{run_dir.name}/{path.name}"] = path.read_bytes()
        summary = json.loads((run_dir / "summary.json").read_text())
        files[f"{run_dir.name}/summary.json"] = {k: v for k, v in summary.items()
                                                 if k not in REAL_TIME_FIELDS}
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1, help="repeats per run (default 1)")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="run only this run of the recipe (repeatable)")
    parser.add_argument("--jobs", type=int, default=2, help="the parallel side (default 2)")
    args = parser.parse_args()
    print(f"{RECIPE.relative_to(ROOT)}, repeats {args.repeats}, "
          f"{len(os.sched_getaffinity(0))} usable cores, load before {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        one = study(Path(tmp) / "one", 1, args)
        print(f"--jobs 1: {one:.1f} s", flush=True)
        many = study(Path(tmp) / "many", args.jobs, args)
        print(f"--jobs {args.jobs}: {many:.1f} s")
        same = results(Path(tmp) / "one") == results(Path(tmp) / "many")
        runs = sum(1 for key in results(Path(tmp) / "one") if key.endswith("summary.json"))
    print(f"speedup {one / many:.2f}x over {runs} runs; results identical: {same}; "
          f"load after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
