"""Virtual time: determinism and speed.

- Determinism: the same run twice in virtual mode; prints whether events.jsonl and every
  worker log are byte-identical (their SHA-256).
- Speed: WBSP's H3 setting at the paper's scale (8 workers, cnn, base_step_s = 0.1, odd
  ranks sleeping 1.5 s per step, 300 virtual seconds, the global model evaluated every
  10 virtual seconds); prints real seconds / virtual seconds (target: <= 0.5), and what
  they went to, per virtual second: the cnn's own math in the workers' local steps, the
  evaluations, and the rest (engine, protocol, event loop, set-up). The run's CPU time is
  printed beside its wall time: on a shared host the wall time also counts time the
  process waited for a core.

Run: ``.venv/bin/python bench/virtual.py [--virtual-s 300] [--eval-s 10]``.
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import time
from pathlib import Path
from typing import Any

from asyncsync.runlog.reading import read_jsonl, worker_logs
from asyncsync.runlog.schema import KEY, Kind
from asyncsync.study.recipe import load_recipe
from asyncsync.study.simulation import simulate
from asyncsync.study.specs import RunSpec

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
interval_s = {eval_s}
[defaults.compute]
base_step_s = 0.1
profile = {{ name = "step_delay", seconds = 1.5, ranks = "odd" }}
[[runs]]
name = "wbsp"
protocol = "wbsp"
"""


def spec_of(root: Path, workers: int, virtual_s: float, eval_s: float = 10.0) -> RunSpec:
    path = root / "bench.toml"
    path.write_text(RECIPE.format(workers=workers, virtual_s=virtual_s, eval_s=eval_s))
    return load_recipe(path).run("wbsp")


def run(spec: RunSpec, run_dir: Path) -> dict[str, Any]:
    run_dir.mkdir(parents=True)
    cpu = time.process_time()
    facts = simulate(spec, run_dir, "bench")
    return {**facts, "cpu_s": time.process_time() - cpu}


def digest(run_dir: Path) -> str:
    files = sorted(run_dir.glob("*.jsonl"))
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--virtual-s", type=float, default=300.0)
    parser.add_argument("--eval-s", type=float, default=10.0,
                        help="virtual seconds between evaluations (default 10)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        small = spec_of(root, 4, 30.0)
        a, b = run(small, root / "a"), run(small, root / "b")
        same = digest(root / "a") == digest(root / "b")
        print(f"determinism: 4 workers, 30 virtual s, twice: logs identical = {same} "
              f"({digest(root / 'a')}), real {a['real_s']} s and {b['real_s']} s")
        spec = spec_of(root, 8, args.virtual_s, args.eval_s)
        facts = run(spec, root / "h3")
        events = read_jsonl(root / "h3" / "events.jsonl")
        stop = next(e for e in events if e[KEY] == Kind.STOP)
        evals = sum(e[KEY] == Kind.EVAL for e in events)
        steps = sum(r["steps"] for records in worker_logs(root / "h3").values()
                    for r in records if r[KEY] == Kind.FINAL)
    per_s = 1.0 / args.virtual_s
    real_s, math_s, eval_s = facts["real_s"], facts["math_real_s"], facts["eval_real_s"]
    print(f"speed: WBSP H3, 8 workers, {args.virtual_s:g} virtual s took {real_s:.1f} real s"
          f" (CPU {facts['cpu_s']:.1f} s): ratio real/virtual = {real_s * per_s:.3f} "
          f"(target <= 0.5; CPU {facts['cpu_s'] * per_s:.3f}); {stop['versions']} versions")
    print(f"  per virtual s: cnn math {math_s * per_s:.3f} ({steps} local steps, "
          f"{1000 * math_s / max(steps, 1):.1f} ms each), evaluation {eval_s * per_s:.3f} "
          f"({evals} every {args.eval_s:g} virtual s, {eval_s / max(evals, 1):.2f} s each), "
          f"rest {(real_s - math_s - eval_s) * per_s:.3f}")


if __name__ == "__main__":
    main()
