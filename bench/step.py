"""Step benchmark: one bsp worker's whole step through `asyncsync run`, against gloo.

Run: ``.venv/bin/python bench/step.py`` (about 1 minute on 2 cores; ``--seconds 10`` for a
quick look, ``--set KEY=VALUE`` passed on to ``asyncsync run``).

As a user would, it runs a recipe it writes to a temp dir: real clock, 1 bsp worker, the
mlp with ``hidden = 3000`` (12.1M float32 parameters, 48 MB) fed ONE sample per step, so
the step is almost all synchronisation; default settings otherwise, 25 s, no target. From
the worker's log (``worker-0.jsonl``), in steady state (the first steps skipped):

- compute ms/step (the compute spans) and exchange ms/step = wall time per step - compute
  time per step: everything the step pays to synchronise, not only the wire;
- a breakdown of the exchange from the request spans: compute end to the first request,
  push, pull (or one fused exchange), the time the server held them (``held_s``), and the
  tail from the last reply to the next compute (adopting the pulled model);
- the union-of-time check from the worker's final totals: compute + comm + held <= wall.

Against it, in the same run: torch.distributed gloo send + recv of a tensor of the same
size between two processes (bench/transport.py's helper), before and after the run.
Prints gloo ms / exchange ms (target >= 0.33).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from benchlib import cli_run
from transport import gloo_round_trips

from asyncsync.runlog.reading import read_jsonl
from asyncsync.runlog.schema import HELD, KEY, Kind
from asyncsync.training.models import mlp

HIDDEN = 3000
INPUT_SHAPE = (1, 32, 32)  # the synthetic task's images
RECIPE = """
name = "bench-step"
[defaults]
workers = 1
clock = "real"
[defaults.stop]
time_s = {seconds}
[defaults.model]
name = "mlp"
options = {{ hidden = {hidden} }}
[defaults.data]
batch_size = 1
[[runs]]
name = "bsp"
protocol = "bsp"
"""
TRANSFERS = (Kind.PUSH, Kind.PULL, Kind.EXCHANGE)


def step_spans(records: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Per step (from one compute span to the next): its length, the compute, and the
    request spans that started in between (duration, held at the server, end)."""
    computes = [r for r in records if r.get(KEY) == Kind.COMPUTE]
    transfers = [r for r in records if r.get(KEY) in TRANSFERS]
    steps = []
    for this, after in itertools.pairwise(computes):
        mine = [r for r in transfers if this["t"] <= r["t"] < after["t"]]
        if not mine:
            continue
        end = max(r["t"] + r["dur"] for r in mine)
        step = {"cycle": after["t"] - this["t"], "compute": this["dur"],
                "lead": min(r["t"] for r in mine) - this["t"] - this["dur"],
                "tail": after["t"] - end}
        for r in mine:
            step[r[KEY]] = r["dur"]
            step[r[KEY] + "_held"] = r[HELD]
            step[r[KEY] + "_end"] = r["t"] + r["dur"]
        steps.append(step)
    return steps


def mean_ms(steps: list[dict[str, float]], key: str) -> float:
    return 1000 * statistics.fmean(s[key] for s in steps)


def breakdown(steps: list[dict[str, float]]) -> list[str]:
    """The exchange's parts, in ms per step, as far as the log separates them."""
    lines = [f"  compute end -> first request      {mean_ms(steps, 'lead'):7.1f}"]
    for kind in TRANSFERS:
        if all(kind in s for s in steps):
            lines.append(f"  {kind + ' (whole request)':<33}{mean_ms(steps, kind):7.1f}"
                         f"   of which held at the server {mean_ms(steps, kind + '_held'):.1f}")
    if all("push" in s and "pull" in s for s in steps):
        after = [{"x": s["pull_end"] - s["push_end"]} for s in steps]
        lines.append(f"  pull ends after the push ends     {mean_ms(after, 'x'):7.1f}")
    if all("exchange" in s for s in steps):
        lines.append("  (one fused push + pull request per step: the log does not split it into "
                     "push and pull)")
    lines.append(f"  last reply -> next compute        {mean_ms(steps, 'tail'):7.1f}"
                 "   (adopting the pulled model; not logged as a span)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=25.0, help="the run's time budget")
    parser.add_argument("--skip", type=int, default=5, help="first steps left out")
    parser.add_argument("--repeats", type=int, default=10, help="gloo round trips")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="passed on to asyncsync run")
    parser.add_argument("--keep", type=Path, default=None,
                        help="write the run's logs here instead of a temp dir")
    args = parser.parse_args()
    torch.set_num_threads(1)
    numel = sum(p.numel() for p in mlp(INPUT_SHAPE, 10, HIDDEN).parameters())
    gloo_before = gloo_round_trips(numel, args.repeats)
    with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        recipe = workdir / "step.toml"
        recipe.write_text(RECIPE.format(seconds=args.seconds, hidden=HIDDEN))
        (run_dir,) = cli_run(workdir, recipe, args.overrides)
        records = read_jsonl(run_dir / "worker-0.jsonl")
    gloo_after = gloo_round_trips(numel, args.repeats)
    final = next(r for r in reversed(records) if r.get(KEY) == Kind.FINAL)
    steps = step_spans(records)[args.skip:]
    if not steps:
        sys.exit(f"only {final['steps']} steps in {args.seconds:g} s: too few to skip "
                 f"{args.skip}; give more --seconds or a smaller --skip")
    compute, wall = mean_ms(steps, "compute"), mean_ms(steps, "cycle")
    exchange = wall - compute
    gloo = 1000 * (gloo_before + gloo_after) / 2
    print(f"model: mlp hidden={HIDDEN}, {numel / 1e6:.1f}M float32 = {numel * 4 / 1e6:.1f} MB, "
          f"1 sample per step; bsp, 1 worker, real clock, {args.seconds:g} s")
    print(f"steps: {final['steps']} ({len(steps)} in steady state, the first {args.skip} "
          "left out)")
    print(f"compute: {compute:.1f} ms/step; exchange: {exchange:.1f} ms/step "
          f"(wall {wall:.1f} ms/step)")
    print(f"gloo send + recv of the same tensor: {gloo:.1f} ms "
          f"(before the run {1000 * gloo_before:.1f}, after {1000 * gloo_after:.1f})")
    print(f"ratio gloo / exchange: {gloo / exchange:.2f} (target >= 0.33)")
    print("breakdown of the step, ms/step (mean over the steady steps):")
    print(f"  compute                           {compute:7.1f}")
    for line in breakdown(steps):
        print(line)
    total = final["compute_s"] + final["comm_s"] + final[HELD]
    verdict = "ok" if total <= final["wall_s"] + 1e-6 else "VIOLATED"
    print(f"time union, worker 0: compute {final['compute_s']:.2f} + comm {final['comm_s']:.2f}"
          f" + held {final[HELD]:.2f} = {total:.2f} s <= wall {final['wall_s']:.2f} s: "
          f"{verdict}")


if __name__ == "__main__":
    main()
