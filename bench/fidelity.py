"""Fidelity of virtual time: one recipe in real paced mode and in virtual mode, compared.

4 workers with slowdowns 1, 1, 2, 4 over a 100 Mbit/s link, paced at ``base_step_s``; for
each protocol it prints compute proportion, versions and time to target in both modes,
their differences (targets: proportions within 0.05, versions within 15 %, times to target
within 25 %) and whether the ranking of the protocols by time to target is the same.

Per run and mode it also prints what the worker logs show of the exchanges: the median
time a message spent moving (request time not held at the server) against what the link
model charges (`charged_s`: the mean round trip, 2 x latency + jitter, and the bytes at
the rate), and the local steps per push of each
worker. Protocols whose rounds end at step boundaries (nbsync: an exchange is adopted at
the first step boundary after it completes) turn a few milliseconds per message into a
whole step per round when the exchange is close to a worker's step time; these lines show
when that happens.

Virtual runs charge each message a software cost (`network.message_overhead_ms`), by
default measured on this host first, as real paced mode pays it: a real push or pull of
the model's size to a sink server over loopback HTTP through the recipe's emulated link,
less what the link model charges, halved (``--overhead-ms 0`` turns it off). It is
measured with the host otherwise idle, so the run's own contention (4 workers and the
server on the host's cores) is not in it.

Run: ``.venv/bin/python bench/fidelity.py [--time-s 40] [--only nbsync]
[--set network.latency_ms=1] [--overhead-ms measure|MS]`` (real mode takes the budget in
wall time per protocol; the host should be otherwise idle).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from benchlib import RUN, SessionClient, push_header, start_server

from asyncsync.hetero.network import Link, LinkSpec
from asyncsync.runlog.reading import worker_logs
from asyncsync.runlog.schema import HELD, KEY, Kind
from asyncsync.study.assembly import run_data, run_model
from asyncsync.study.recipe import load_recipe
from asyncsync.study.runner import run_recipe
from asyncsync.transport.http_client import HttpTransport

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


def charged_s(link: LinkSpec, nbytes: int, mbps: float) -> float:
    """What the link model charges a request moving `nbytes` one way at `mbps` (0:
    unlimited): its mean round trip (each one-way delay is the latency plus a uniform
    draw in [0, jitter]) and the bytes at the rate."""
    return link.round_trip_s + (nbytes * 8 / (mbps * 1e6) if mbps else 0.0)


def exchanges(logs: Path, run: str, link: LinkSpec) -> str:
    """What the worker logs of `run` under `logs` show of its messages (see the module
    docstring): median moving time of pushes and of pulls, the link model's charge for a
    push on `link` (worker 0's), and each worker's local steps per push."""
    moving: dict[str, list[float]] = {"push": [], "pull": [], "exchange": []}
    per_push: list[str] = []
    pushed = 0
    for records in (r for run_dir in sorted(logs.glob(f"*/*/{run}"))
                    for r in worker_logs(run_dir).values()):
        steps = pushes = 0
        for record in records:
            if record[KEY] == Kind.COMPUTE:
                steps += record["steps"]
            elif record[KEY] in moving:
                moving[record[KEY]].append(record["dur"] - record[HELD])
                if record[KEY] in (Kind.PUSH, Kind.EXCHANGE):
                    pushes += 1
                    pushed = max(pushed, record["up"])
        per_push.append(f"{steps / pushes:.2f}" if pushes else "-")
    if not pushed:
        return "no pushes"
    model_ms = charged_s(link, pushed, link.uplink_mbps) * 1e3
    medians = ", ".join(f"{kind} {statistics.median(times) * 1e3:.1f}"
                        for kind, times in moving.items() if times)
    return (f"message moving ms: {medians} (link model per message {model_ms:.1f}); "
            f"local steps per push by rank {'/'.join(per_push)}")


async def overhead_ms(numel: int, link: LinkSpec, channel: str, repeats: int = 20) -> float:
    """The software cost of one message on this host, as real paced mode pays it: the
    median real time of a push and of a pull of `numel` floats over HTTP on loopback (on
    `channel`) through the recipe's emulated `link`, less what the link model charges for
    the request (`charged_s`), halved (a request is two messages)."""
    proc, port, done = start_server(numel)
    client = SessionClient(HttpTransport(f"http://127.0.0.1:{port}", numel, link=Link(link),
                                         channel=channel))
    reply, _ = await client.request("join", {"worker": 0, "run_id": RUN})
    client.session = str(reply["meta"]["session"])
    vector = torch.full((numel,), 1e-3)
    extra = []
    try:
        for k in range(repeats + 2):  # two to warm up connections and pools
            began = time.perf_counter()
            if k % 2:
                await client.request("push", push_header(0), vector)
                mbps = link.uplink_mbps
            else:
                await client.request("pull", {"worker": 0, "run_id": RUN, "base_version": 0})
                mbps = link.downlink_mbps
            extra.append(time.perf_counter() - began - charged_s(link, numel * 4, mbps))
    finally:
        await client.close()
        done.set()
        proc.join()
    return max(0.0, statistics.median(extra[2:]) * 1e3 / 2)


def model_and_link(recipe_path: Path, overrides: list[str]) -> tuple[int, LinkSpec, str]:
    """The recipe's model length, worker 0's link and the channel."""
    spec = load_recipe(recipe_path, overrides).runs[0]
    numel = sum(p.numel() for p in run_model(spec, run_data(spec)).state_dict().values())
    return numel, spec.network.link(0), spec.network.channel


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
    parser.add_argument("--overhead-ms", default="measure", metavar="MS",
                        help="network.message_overhead_ms of the virtual runs: 'measure' "
                             "(half a real loopback request of the model's size on this "
                             "host, measured first) or a number, e.g. 0")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fidelity.toml"
        path.write_text(RECIPE.format(time_s=args.time_s))
        if args.overhead_ms == "measure":
            overhead = asyncio.run(overhead_ms(*model_and_link(path, args.set)))
        else:
            overhead = float(args.overhead_ms)
        print(f"virtual runs charge {overhead:.2f} ms of software cost per message")
        results = {}
        notes = {}
        for clock in ("real", "virtual"):
            extra = [f"network.message_overhead_ms={overhead}"] if clock == "virtual" else []
            recipe = load_recipe(path, [*args.set, *extra, f'clock="{clock}"'], args.only)
            results[clock] = asyncio.run(run_recipe(recipe, Path(tmp) / clock, live=False))
            notes[clock] = {spec.name: exchanges(Path(tmp) / clock, spec.name,
                                                 spec.network.link(0))
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
