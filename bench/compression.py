"""Compression benchmark: bytes per push and time to target of each codec, against float32.

Run: ``.venv/bin/python bench/compression.py`` (the whole recipes/compression.toml, about
10 minutes on 2 cores) or ``--quick`` (about 2.5 minutes: 10 virtual seconds per run and
target 0.6 instead of 40 s and 0.7, so that the nbsync runs reach it; bsp reaches neither).
``--bfloat16`` adds a bfloat16 run beside each float16 one; ``--set KEY=VALUE`` is passed on
to ``asyncsync run``.

Runs the recipe (bsp and nbsync, 4 workers over 20 Mbit/s and 40 ms links, virtual clock,
so the figures do not depend on the host) through ``asyncsync run``, then reads each run's
logs: bytes per push = the tensor bytes of its workers' pushes (``up`` of the push and fused
exchange spans in the worker logs) / their number, and beside it all bytes up (headers
and heartbeats included, ``bytes_up`` of summary.json) / pushes; time to target and final
accuracy from summary.json. Ratios are to the float32 run of the same protocol.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import tomllib
from pathlib import Path
from typing import Any

from benchlib import cli_run

from asyncsync.runlog.reading import worker_logs
from asyncsync.runlog.schema import KEY, Kind

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "compression.toml"
QUICK = ["stop.time_s=10", "stop.target_accuracy=0.6"]
PUSHES = (Kind.PUSH, Kind.EXCHANGE)


def write_recipe(workdir: Path, bfloat16: bool) -> Path:
    """The recipe as JSON (which `asyncsync run` reads too), with bfloat16 runs if asked."""
    raw = tomllib.loads(RECIPE.read_text())
    if bfloat16:
        runs = []
        for run in raw["runs"]:
            runs.append(run)
            if run.get("network", {}).get("compression") == "float16":
                runs.append({**run, "name": run["name"].replace("float16", "bfloat16"),
                             "network": {**run["network"], "compression": "bfloat16"}})
        raw["runs"] = runs
    path = workdir / "compression.json"
    path.write_text(json.dumps(raw))
    return path


def measure(run_dir: Path) -> dict[str, Any]:
    """A run's protocol, codec, pushes and their bytes, and its summary's figures."""
    spec = json.loads((run_dir / "recipe.json").read_text())["runs"][0]
    summary = json.loads((run_dir / "summary.json").read_text())
    pushes = payload = 0
    for records in worker_logs(run_dir).values():
        for record in records:
            if record.get(KEY) in PUSHES:
                pushes += 1
                payload += record["up"]
    codec = spec["network"]["compression"]
    if codec == "topk":
        codec += f" {spec['network']['topk_fraction']:g}"
    return {"run": run_dir.name, "protocol": spec["protocol"]["name"], "codec": codec,
            "pushes": pushes, "payload": payload / max(pushes, 1),
            "wire": summary["bytes_up"] / max(pushes, 1), "ttt": summary["time_to_target_s"],
            "versions": summary["versions"], "final": summary["final_accuracy"],
            "target": summary["target_accuracy"], "time_s": spec["stop"]["time_s"]}


def ratio(value: float | None, reference: float | None) -> str:
    return "-" if value is None or not reference else f"{value / reference:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="10 virtual s per run, target 0.6 (about 2.5 minutes)")
    parser.add_argument("--bfloat16", action="store_true",
                        help="add a bfloat16 run beside each float16 one")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="passed on to asyncsync run")
    parser.add_argument("--keep", type=Path, default=None,
                        help="write the runs' logs here instead of a temp dir")
    args = parser.parse_args()
    overrides = (QUICK if args.quick else []) + args.overrides
    with tempfile.TemporaryDirectory(prefix="bench-compression-") as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        rows = [measure(d) for d in cli_run(workdir, write_recipe(workdir, args.bfloat16),
                                               overrides)]
    reference = {r["protocol"]: r for r in rows if r["codec"] == "none"}
    first = rows[0]
    print(f"recipes/compression.toml: {first['time_s']:g} virtual s per run, target "
          f"{first['target']}, {' '.join(overrides) or 'as shipped'}")
    print(f"{'run':<16}{'codec':<10}{'pushes':>7}{'B/push':>10}{'x f32':>7}{'up B/push':>11}"
          f"{'t->target':>10}{'x f32':>7}{'versions':>9}{'final acc':>10}")
    for r in rows:
        base = reference.get(r["protocol"], {})
        ttt = "-" if r["ttt"] is None else f"{r['ttt']:.1f}"
        final = "-" if r["final"] is None else f"{r['final']:.3f}"
        print(f"{r['run']:<16}{r['codec']:<10}{r['pushes']:>7}{r['payload']:>10.0f}"
              f"{ratio(r['payload'], base.get('payload')):>7}{r['wire']:>11.0f}{ttt:>10}"
              f"{ratio(r['ttt'], base.get('ttt')):>7}{r['versions']:>9}{final:>10}")
    print("B/push: tensor bytes per push (compressed payload); up B/push: all bytes up / "
          "pushes; t->target in virtual s; x f32: ratio to the same protocol's float32 run")


if __name__ == "__main__":
    main()
