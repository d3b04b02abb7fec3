"""What the CLI prints about a recipe and the toolkit before anything runs: `check`'s
tables (the resolved runs, and each run's step time), `devices` and `protocols`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console, Group
from rich.table import Table

from asyncsync.protocols import discover
from asyncsync.results.layout import measured, run_block
from asyncsync.schema import describe
from asyncsync.study.recipe import Recipe
from asyncsync.study.specs import TIMING_MODEL, RunSpec

if TYPE_CHECKING:
    from asyncsync.training.data import Dataset


def _changed(params: Any) -> str:
    """A parameter dataclass's values that differ from its defaults, as ``key=value``."""
    default = type(params)()
    return " ".join(f"{f.name}={_toml(getattr(params, f.name))}"
                    for f in dataclasses.fields(params)
                    if getattr(params, f.name) != getattr(default, f.name))


def _figures(value: Any, zero: str = "inf") -> str:
    """A link figure, or one per worker, compactly (`zero` for 0: unlimited bandwidth)."""
    if isinstance(value, list):
        return ",".join(_figures(v, zero) for v in value)
    return f"{value:g}" if value else zero


CHECK_HEADERS = ("run", "protocol", "workers", "compute", "network", "data", "model",
                 "budget", "clock")
"""The columns of `check_table`."""

def check_table(recipe: Recipe, width: int | None = None) -> Table | Group:
    """The resolved runs, one row each: what differs between them at a glance; where the
    table cannot fit `width` without breaking a word (a header, a value), one block per
    run instead."""
    rows = [_check_row(spec) for spec in recipe.runs]
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for header in CHECK_HEADERS:
        table.add_column(header, overflow="fold")
    for row in rows:
        table.add_row(*row)
    if width is None or measured(table).minimum <= width:
        return table  # a cell too long for its column wraps between words
    return Group(*(run_block(name, protocol, [
        (f"  {header}", value) for header, value in zip(CHECK_HEADERS[2:], values, strict=True)])
        for name, protocol, *values in rows))


def _check_row(spec: RunSpec) -> tuple[str, ...]:
    """One run's row of `check_table`."""
    compute = spec.compute
    factors = ",".join(f"{f:g}" for f in compute.slowdown) or "1"
    if 0 < len(compute.slowdown) < spec.workers:  # the rest run at 1x: say so
        factors += f" +{spec.workers - len(compute.slowdown)} at 1"
    traced = bool(spec.capacity.trace)  # the trace's speeds and links, slowed as asked
    speed = ("trace" + (f" x {factors}" if compute.slowdown else "")) if traced \
        else f"{factors}x"
    steps = (speed + (f" {compute.profile['name']}" if compute.profile else "")
             + (f" step {compute.explicit_step_s:g} s" if compute.explicit_step_s
                else ""))
    net = spec.network
    up = net.uplink_mbps if net.uplink_mbps is not None else net.bandwidth_mbps
    down = net.downlink_mbps if net.downlink_mbps is not None else net.bandwidth_mbps
    delay = f" {_figures(net.latency_ms, '0')}ms"
    if traced:
        link = "trace" + (delay if net.latency_ms else "")
    else:
        link = "-" if not (up or down or net.latency_ms) else (
            f"{_figures(up)}/{_figures(down)}M{delay}")
    data = spec.data
    stop = spec.stop
    budget = (f"{stop.time_s:g} s" + (f", to {stop.target_accuracy:g}"
                                      if stop.stop_at_target else ""))
    return (spec.name, f"{spec.protocol.name} {_changed(spec.protocol.params)}".strip(),
            str(spec.workers), steps, link,
            f"{data.name} {data.partition} b{data.batch_size}", spec.model.name,
            budget, spec.clock)


STEP_GROUPS_IN_FULL = 8
"""Up to this many distinct step times `step_time_table` lists each; above, a summary."""


def step_time_table(recipe: Recipe, data: Callable[[RunSpec], Dataset] | None = None,
                    ) -> Table:
    """How each run's steps are charged before slowness: per worker (identical workers
    grouped), the device, FLOPs and seconds of one step of the recipe's batch (on the
    run's dataset from `data`, by default loaded for each run)."""
    from asyncsync.study.assembly import dataset_loader
    from asyncsync.study.simulation import run_step_times

    data = data or dataset_loader()

    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False,
                  title="step time before slowness", title_justify="left")
    for header in ("run", "source", "workers: device, FLOPs and time per step"):
        table.add_column(header, overflow="fold")
    for spec in recipe.runs:
        if spec.clock != "virtual":
            paced = spec.compute.explicit_step_s
            table.add_row(spec.name, "explicit (paced)" if paced else "this host (real)",
                          f"{paced:g} s" if paced else "-")
            continue
        if spec.compute.calibrate:
            table.add_row(spec.name, "calibrate (host-dependent)", "measured when run")
            continue
        times = run_step_times(spec, None, None if spec.model.name == TIMING_MODEL
                               else data(spec))
        groups: dict[str, int] = {}
        for worker in times.workers:
            text = (f"{worker['device']} {worker['flops_per_step'] / 1e6:.4g} MFLOP "
                    if "device" in worker else "") + f"{worker['step_s'] * 1e3:.4g} ms"
            groups[text] = groups.get(text, 0) + 1
        if len(groups) > STEP_GROUPS_IN_FULL:  # e.g. a capacity trace: a summary
            seconds = sorted(worker["step_s"] * 1e3 for worker in times.workers)
            text = (f"{len(seconds)} workers, min / median / max {seconds[0]:.4g} / "
                    f"{seconds[len(seconds) // 2]:.4g} / {seconds[-1]:.4g} ms")
        else:
            text = "; ".join(f"{count} x {text}" for text, count in groups.items())
        table.add_row(spec.name, times.source, text)
    return table


SHARDS_IN_FULL = 32
"""Up to this many workers `shards_table` lists each worker; above, a summary per run."""


def _spread(values: list[int]) -> str:
    ordered = sorted(values)
    return f"{ordered[0]} / {ordered[len(ordered) // 2]} / {ordered[-1]}"


def shards_table(recipe: Recipe, data: Callable[[RunSpec], Dataset] | None = None) -> Table:
    """Each worker's shard: its size and classes (above `SHARDS_IN_FULL` workers, the
    min / median / max of both per run; datasets from `data`, as in `step_time_table`)."""
    from asyncsync.study.assembly import dataset_loader, run_shards

    load = data or dataset_loader()

    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False,
                  title="data per worker", title_justify="left")
    for header in ("run", "partition", "worker", "samples", "classes"):
        table.add_column(header, overflow="fold")
    for spec in recipe.runs:
        if spec.model.name == TIMING_MODEL:
            continue
        dataset = load(spec)
        shards = run_shards(spec, dataset)
        labels = [sorted({int(c) for c in dataset.train_y[shard].tolist()})
                  for shard in shards]
        if spec.workers <= SHARDS_IN_FULL:
            for rank, (shard, held) in enumerate(zip(shards, labels, strict=True)):
                table.add_row(spec.name if rank == 0 else "",
                              spec.data.partition if rank == 0 else "", str(rank),
                              str(len(shard)), ",".join(map(str, held)))
        else:
            table.add_row(spec.name, spec.data.partition, f"{spec.workers} (min/med/max)",
                          _spread([len(s) for s in shards]),
                          _spread([len(held) for held in labels]) + " classes")
    return table


def population_table(recipe: Recipe) -> Table | None:
    """Runs with an availability or capacity trace: what share of the budget the workers
    are online, when none is, and the capacity rows drawn (None: no such run)."""
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False,
                  title="population", title_justify="left")
    for header in ("run", "availability", "online", "all offline", "capacity rows"):
        table.add_column(header, overflow="fold")
    for spec in recipe.runs:
        facts = spec.population().facts()
        if not facts:
            continue
        online = facts.get("availability", {})
        rows = facts.get("capacity_rows")
        table.add_row(spec.name, online.get("source", "-"),
                      f"{online['mean_online_share']:.0%} mean, {online['never_online']} "
                      "never" if online else "-",
                      f"{online['all_offline_s']:g} s" if online else "-",
                      f"{len(set(rows))} distinct of {len(rows)}" if rows else "-")
    return table if table.row_count else None


def devices_table() -> Table:
    """The named devices: FP32 peak, efficiency, per-operation time and the source."""
    from asyncsync.hetero.cost_model import DEVICES

    headers = ("device", "peak TFLOP/s", "efficiency", "per op (us)", "source")
    rows = [(dev.name, f"{dev.peak_flops_per_s / 1e12:.3g}", f"{dev.efficiency:g}",
             f"{dev.op_overhead_s * 1e6:g}", dev.source) for dev in DEVICES.values()]
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for index, header in enumerate(headers):  # a narrow terminal wraps between words
        words = [word for text in (header, *(row[index] for row in rows)) for word in
                 text.split()]
        table.add_column(header, overflow="fold", min_width=None if index == len(headers) - 1
                         else max(map(len, words)))
    for row in rows:
        table.add_row(*row)
    return table


def _toml(value: Any) -> str:
    """`value` as a recipe writes it (TOML)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return str(value)


def _own_first(cls: type[Any]) -> list[tuple[str, Any, str]]:
    """`describe(cls)` with the protocol's own parameters first, then the inherited ones."""
    def depth(name: str) -> int:
        return next(i for i, base in enumerate(cls.__mro__)
                    if name in vars(base).get("__annotations__", {}))

    return sorted(describe(cls), key=lambda row: depth(row[0]))


def print_protocols(console: Console) -> None:
    for name, proto in sorted(discover().items()):
        console.print(f"[bold]{name}[/bold]: {proto.summary}", highlight=False)
        for field_name, default, text in _own_first(proto.params):
            value = "(no default: unset)" if default is None else f"= {_toml(default)}"
            console.print(f"    {field_name} {value}" + (f"  # {text}" if text else ""),
                          highlight=False, markup=False)
