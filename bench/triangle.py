"""The fidelity triangle: the same recipes on the virtual clock, in real time with app
pacing, and in real time with kernel-shaped links (``network.emulation = "kernel"``).

Per recipe and protocol it prints time to target, versions, compute proportion and bytes
moved in each of the three ways (means over ``--repeats``), the differences of virtual and
app against kernel (target for time to target: within 15 %), and whether the three rank
the protocols the same way by time to target. "msg/model" is the median time a message
took to move over what the link model charges for it (`message_ratio`): the network's
part of a difference, apart from the CPU the nodes share. First it measures bytes-on-the-wire time
through a kernel-shaped link: one large transfer between two namespaces, against what
tc was told (target: within 10 %).

A way that cannot run a recipe says why and is left out: app pacing has no shared server
link (it runs without ``server_mbps``) and cannot drop packets; kernel shaping needs root,
ip, tc, and the netem qdisc for delay, jitter and loss. Where the kernel lacks netem, a
recipe whose links have delay (but no loss) runs all three ways without it, and says so.

Run (as root): ``.venv/bin/python bench/triangle.py [--time-s 30] [--target 0.5]
[--repeats 1] [--only paper_dssync] [--runs bsp,nbsync] [--transfer-mb 10] [--logs DIR]``;
the load of the host (``uptime``) is printed before and after, as the real runs measure
it. ``--tables-from DIR`` prints the tables again from the logs a run kept in DIR.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from asyncsync.runlog.reading import worker_logs
from asyncsync.runlog.schema import HELD, KEY
from asyncsync.schema import ConfigError
from asyncsync.study import netns
from asyncsync.study.hetero_specs import NetworkSpec
from asyncsync.study.recipe import Recipe, load_recipe
from asyncsync.study.runner import run_recipe
from asyncsync.study.specs import RunSpec

RECIPES = Path(__file__).parents[1] / "recipes"
TRIANGLE = {"paper_nbsync": [], "paper_wbsp_h2": [],
            "paper_dssync": ["network.server_mbps=80"], "wan_loss": []}
"""The recipes and their extra settings (paper_dssync: a shared server link of 80 Mbit/s,
half what its four 40 Mbit/s workers could send at once)."""
WAYS = {"virtual": ['clock="virtual"'], "app": ['clock="real"', 'network.emulation="app"'],
        "kernel": ['clock="real"', 'network.emulation="kernel"']}
NO_DELAY = ["network.latency_ms=0", "network.jitter_ms=0"]
SINK = """
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 5001)); s.listen(); print("up", flush=True)
c, _ = s.accept(); total = 0
while (b := c.recv(1 << 20)):
    total += len(b)
c.sendall(str(total).encode())
"""
SEND = """
import socket, sys, time
s = socket.create_connection((sys.argv[1], 5001)); data = bytes(int(sys.argv[2]))
t = time.perf_counter(); s.sendall(data); s.shutdown(socket.SHUT_WR); s.recv(64)
print(time.perf_counter() - t)
"""
ETHERNET_PER_SEGMENT = 1448 + 52 + 14
"""Bytes a full TCP segment takes on the veth: payload, IP+TCP with timestamps, Ethernet."""


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def wire_time(mbps: float, megabytes: float) -> str:
    """One transfer of `megabytes` through a link shaped to `mbps`: time against tc's."""
    network = netns.RunNetwork(NetworkSpec(bandwidth_mbps=mbps), 1)
    network.create()
    try:
        server = network.address("server")
        sink = subprocess.Popen([*network.command("server"), sys.executable, "-c", SINK,
                                 server], stdout=subprocess.PIPE, text=True)
        assert sink.stdout is not None and sink.stdout.readline().strip() == "up"
        nbytes = round(megabytes * 1e6)
        sent = subprocess.run([*network.command("w0"), sys.executable, "-c", SEND, server,
                               str(nbytes)], capture_output=True, text=True, check=True)
        sink.wait()
    finally:
        network.remove()
    took = float(sent.stdout)
    payload_s = nbytes * 8 / (mbps * 1e6)
    wire_s = payload_s * ETHERNET_PER_SEGMENT / 1448
    return (f"{megabytes:g} MB through tbf {mbps:g} Mbit/s: {took:.3f} s; tc's rate gives "
            f"{payload_s:.3f} s for the payload, {wire_s:.3f} s with TCP/IP/Ethernet headers: "
            f"{took / payload_s:.3f} / {took / wire_s:.3f} of them (target within 10 %)")


def ways(name: str, extra: list[str]) -> dict[str, tuple[list[str], str]]:
    """Each way's overrides for recipe `name`, with a note ('' when as given); a way
    that cannot run it maps to ([], why)."""
    base = load_recipe(RECIPES / f"{name}.toml", [*extra, *WAYS["virtual"]])
    chosen: dict[str, tuple[list[str], str]] = {}
    lossy = any(s.network.link(r).loss_pct for s in base.runs for r in range(s.workers))
    try:
        netns.preflight(load_recipe(RECIPES / f"{name}.toml",
                                    [*extra, *WAYS["kernel"]]).runs)
        no_delay, kernel_problem = False, ""
    except ConfigError as exc:  # without netem, delay (not loss) is dropped for all three
        no_delay = "netem" in str(exc) and not lossy
        kernel_problem = "" if no_delay else str(exc)
    for way, settings in WAYS.items():
        if way == "kernel" and kernel_problem:
            chosen[way] = ([], kernel_problem)
            continue
        over = [*extra, *(NO_DELAY if no_delay else []), *settings]
        note = "without delay (no netem)" if no_delay else ""
        if way == "app" and any("server_mbps" in o for o in extra):
            over = [o for o in over if "server_mbps" not in o]
            note = "no server link (app pacing has none)"
        try:
            load_recipe(RECIPES / f"{name}.toml", over)
            chosen[way] = (over, note)
        except ConfigError as exc:
            chosen[way] = ([], str(exc))
    return chosen


def chosen(name: str, runs: str) -> list[str]:
    """The runs of recipe `name` among the comma-separated `runs` (all when empty)."""
    names = [spec.name for spec in load_recipe(RECIPES / f"{name}.toml",
                                               WAYS["virtual"]).runs]
    return [n for n in names if n in runs.split(",")] if runs else names


def message_ratio(run_dir: Path, spec: RunSpec) -> float | None:
    """Median, over a run's pushes, pulls and exchanges, of the time a message moved (its
    request's time less what the server held it) over what the link model charges for it
    (the mean round trip, 2 x latency + jitter, and its bytes each way at the worker's
    rate); None without a shaped link."""
    ratios = []
    for rank, records in worker_logs(run_dir).items():
        link = spec.network.link(rank)
        up, down = (link.effective_mbps(m) for m in (link.uplink_mbps, link.downlink_mbps))
        for record in records:
            if record[KEY] not in ("push", "pull", "exchange"):
                continue
            model = link.round_trip_s + sum(
                record[way] * 8 / (mbps * 1e6) for way, mbps in (("up", up), ("down", down))
                if mbps)
            if model > 0:
                ratios.append((record["dur"] - record[HELD]) / model)
    return statistics.median(ratios) if ratios else None


def means(summaries: list[dict[str, Any]], ratios: dict[str, float | None]
          ) -> dict[str, dict[str, Any]]:
    """Per run: mean time to target (of the repeats that reached it), versions, compute
    proportion and MB moved, how many repeats reached the target, and `ratios`' entry."""
    by_run: dict[str, list[dict[str, Any]]] = {}
    for summary in summaries:
        by_run.setdefault(summary["run"], []).append(summary)
    table = {}
    for run, group in by_run.items():
        times = [s["time_to_target_s"] for s in group if s.get("time_to_target_s") is not None]
        table[run] = {
            "ttt": statistics.mean(times) if times else None,
            "reached": f"{len(times)}/{len(group)}",
            "versions": statistics.mean(s.get("versions", 0) for s in group),
            "compute": statistics.mean(s.get("compute_proportion", 0.0) for s in group),
            "mb": statistics.mean((s.get("bytes_up", 0) + s.get("bytes_down", 0)) / 1e6
                                  for s in group),
            "best": statistics.mean(s.get("best_accuracy") or 0.0 for s in group),
            "msg": ratios.get(run)}
    return table


def ranking(table: dict[str, dict[str, Any]]) -> list[str]:
    """Runs by time to target; those that never reached it after, by best accuracy."""
    return sorted(table, key=lambda r: (table[r]["ttt"] is None, table[r]["ttt"] or 0.0,
                                        -table[r]["best"], r))


def gap(value: float | None, reference: float | None) -> str:
    if value is None or reference is None or not reference:
        return "-"
    return f"{(value - reference) / reference:+.0%}"


def show(name: str, results: dict[str, dict[str, dict[str, Any]]],
         notes: dict[str, str]) -> None:
    print(f"\n## {name}")
    for way, note in notes.items():
        if note:
            print(f"  {way}: {note}")
    print("| run | way | t→target s (reached) | versions | compute | MB moved | msg/model "
          "| t→target vs kernel | versions vs kernel |")
    print("|---" * 9 + "|")
    for run in next(iter(results.values())):
        kernel = results.get("kernel", {}).get(run, {})
        for way, table in results.items():
            row = table[run]
            ttt = (f"- ({row['reached']}, best {row['best']:.2f})" if row["ttt"] is None
                   else f"{row['ttt']:.1f} ({row['reached']})")
            msg = "-" if row.get("msg") is None else f"{row['msg']:.2f}"
            print(f"| {run} | {way} | {ttt} | {row['versions']:.0f} | "
                  f"{row['compute']:.2f} | {row['mb']:.0f} | {msg} | "
                  f"{gap(row['ttt'], kernel.get('ttt'))} | "
                  f"{gap(row['versions'], kernel.get('versions'))} |")
    orders = {way: ranking(table) for way, table in results.items()}
    same = len({tuple(order) for order in orders.values()}) == 1
    print("ranking by time to target (then best accuracy): " + "; ".join(f"{w} {' < '.join(o)}"
                                                    for w, o in orders.items())
          + f": {'same' if same else 'DIFFERENT'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--time-s", type=float, default=30.0,
                        help="stop.time_s of every run (default 30)")
    parser.add_argument("--target", type=float, default=None,
                        help="stop.target_accuracy of every run (default: the recipe's)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--only", action="append", default=[], metavar="RECIPE",
                        help=f"one of {', '.join(TRIANGLE)} (repeatable)")
    parser.add_argument("--runs", default="", metavar="A,B",
                        help="only these runs of each recipe (those it has; default all)")
    parser.add_argument("--transfer-mb", type=float, default=10.0,
                        help="the wire-time transfer's size (0: skip it)")
    parser.add_argument("--logs", type=Path, default=None,
                        help="keep the runs' logs here (default: a temporary folder)")
    parser.add_argument("--tables-from", type=Path, default=None, metavar="LOGS",
                        help="run nothing: print the tables of the runs kept in LOGS")
    args = parser.parse_args()
    if args.tables_from:
        tables(args, args.tables_from, run=False)
        return
    print(f"load before: {load()} ({os.cpu_count()} CPUs)", flush=True)
    if args.transfer_mb:
        try:
            netns.check_host(netem=False)
        except ConfigError as exc:  # not root, or root in a user namespace
            print(f"no wire-time transfer: {exc}", flush=True)
        else:
            print(wire_time(20.0, args.transfer_mb), flush=True)
    if args.logs:
        tables(args, args.logs, run=True)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            tables(args, Path(tmp), run=True)
    print(f"\nload after: {load()}")


def tables(args: argparse.Namespace, logs: Path, run: bool) -> None:
    """Run (`run`) or re-read from `logs` each recipe's ways, and print their table."""
    target = [f"stop.target_accuracy={args.target}"] if args.target else []
    for name in args.only or TRIANGLE:
        notes: dict[str, str] = {}
        results: dict[str, dict[str, dict[str, Any]]] = {}
        for way, (over, note) in ways(name, TRIANGLE[name]).items():
            notes[way] = note
            if not over:
                continue
            recipe: Recipe = load_recipe(RECIPES / f"{name}.toml",
                                         [*over, f"stop.time_s={args.time_s}", *target],
                                         chosen(name, args.runs), args.repeats)
            if run:
                began = time.monotonic()
                asyncio.run(run_recipe(recipe, logs / way, live=False))
                print(f"{name} {way}: {time.monotonic() - began:.0f} s, load {load()}",
                      flush=True)
            run_dirs = {spec.name: sorted((logs / way).glob(f"{name}/*/{spec.name}"))[-1:]
                        + sorted((logs / way).glob(f"{name}/*/{spec.name}-r*"))
                        for spec in recipe.runs}
            if not all(run_dirs.values()):
                notes[way] = f"no runs in {logs / way}"
                continue
            summaries = [json.loads((d / "summary.json").read_text())
                         for dirs in run_dirs.values() for d in dirs]
            ratios = {spec.name: message_ratio(run_dirs[spec.name][0], spec)
                      for spec in recipe.runs}
            results[way] = means(summaries, ratios)
        show(name, results, notes)


if __name__ == "__main__":
    main()
