"""Virtual time: determinism and speed.

- Determinism: the same run twice in virtual mode; prints whether events.jsonl and every
  worker log are byte-identical (their SHA-256).
- Speed: WBSP's H3 setting at the paper's scale (8 workers, cnn, base_step_s = 0.1, odd
  ranks sleeping 1.5 s per step, 300 virtual seconds); prints real seconds / virtual
  seconds (target: <= 0.5).

Run: ``.venv/bin/python bench/virtual.py [--virtual-s 300]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
from pathlib import Path

from asyncsync.recipe import RunSpec, load_recipe
from asyncsync.simulation import simulate

RECIPE = """
name = "bench-virtual"
[defaults]
workers = {workers}
clock = "virtual"
[defaults.stop]
time_s = {virtual_s}
[defaults.model]
name = "cnn"
[defaults.eval]
interval_s = 10
[defaults.compute]
base_step_s = 0.1
profile = {{ name = "step_delay", seconds = 1.5, ranks = "odd" }}
[[runs]]
name = "wbsp"
protocol = "wbsp"
"""


def spec_of(root: Path, workers: int, virtual_s: float) -> RunSpec:
    path = root / "bench.toml"
    path.write_text(RECIPE.format(workers=workers, virtual_s=virtual_s))
    return load_recipe(path).run("wbsp")


def run(spec: RunSpec, run_dir: Path) -> dict[str, object]:
    run_dir.mkdir(parents=True)
    return simulate(spec, run_dir, "bench", spec.compute.base_step_s)


def digest(run_dir: Path) -> str:
    files = sorted(run_dir.glob("*.jsonl"))
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--virtual-s", type=float, default=300.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        small = spec_of(root, 4, 30.0)
        a, b = run(small, root / "a"), run(small, root / "b")
        same = digest(root / "a") == digest(root / "b")
        print(f"determinism: 4 workers, 30 virtual s, twice: logs identical = {same} "
              f"({digest(root / 'a')}), real {a['real_s']} s and {b['real_s']} s")
        spec = spec_of(root, 8, args.virtual_s)
        facts = run(spec, root / "h3")
        real_s = float(str(facts["real_s"]))
        events = [json.loads(line) for line in (root / "h3" / "events.jsonl").open()]
        stop = next(e for e in events if e["event"] == "stop")
        print(f"speed: WBSP H3, 8 workers, {args.virtual_s:g} virtual s took {real_s:.1f} real s"
              f": ratio real/virtual = {real_s / args.virtual_s:.3f} (target <= 0.5); "
              f"{stop['versions']} versions")


if __name__ == "__main__":
    main()
