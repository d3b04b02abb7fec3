"""What the CLI prints about a recipe and the toolkit before anything runs: `check`'s
tables (the resolved runs, and each run's step time), `devices` and `protocols`."""

from __future__ import annotations

import dataclasses
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from asyncsync.protocols import discover
from asyncsync.schema import describe
from asyncsync.study.recipe import Recipe


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


def check_table(recipe: Recipe) -> Table:
    """The resolved runs, one row each: what differs between them at a glance."""
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for header in ("run", "protocol", "workers", "compute", "network", "data", "model",
                   "budget", "clock"):
        table.add_column(header, overflow="fold")
    for spec in recipe.runs:
        compute = spec.compute
        factors = ",".join(f"{f:g}" for f in compute.slowdown) or "1"
        if 0 < len(compute.slowdown) < spec.workers:  # the rest run at 1x: say so
            factors += f" +{spec.workers - len(compute.slowdown)} at 1"
        steps = (f"{factors}x" + (f" {compute.profile['name']}" if compute.profile else "")
                 + (f" step {compute.explicit_step_s:g} s" if compute.explicit_step_s
                    else ""))
        net = spec.network
        up = net.uplink_mbps if net.uplink_mbps is not None else net.bandwidth_mbps
        down = net.downlink_mbps if net.downlink_mbps is not None else net.bandwidth_mbps
        link = "-" if not (up or down or net.latency_ms) else (
            f"{_figures(up)}/{_figures(down)}M {_figures(net.latency_ms, '0')}ms")
        data = spec.data
        stop = spec.stop
        budget = (f"{stop.time_s:g} s" + (f", to {stop.target_accuracy:g}"
                                          if stop.stop_at_target else ""))
        table.add_row(spec.name, f"{spec.protocol.name} {_changed(spec.protocol.params)}",
                      str(spec.workers), steps, link,
                      f"{data.name} {data.partition} b{data.batch_size}", spec.model.name,
                      budget, spec.clock)
    return table


def step_time_table(recipe: Recipe) -> Table:
    """How each run's steps are charged before slowness: per worker (identical workers
    grouped), the device, FLOPs and seconds of one step of the recipe's batch."""
    from asyncsync.study.simulation import run_step_times

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
        times = run_step_times(spec)
        groups: dict[str, int] = {}
        for worker in times.workers:
            text = (f"{worker['device']} {worker['flops_per_step'] / 1e6:.4g} MFLOP "
                    if "device" in worker else "") + f"{worker['step_s'] * 1e3:.4g} ms"
            groups[text] = groups.get(text, 0) + 1
        table.add_row(spec.name, times.source,
                      "; ".join(f"{count} x {text}" for text, count in groups.items()))
    return table


def devices_table() -> Table:
    """The named devices: FP32 peak, efficiency, per-operation time and the source."""
    from asyncsync.hetero.cost_model import DEVICES

    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for header in ("device", "peak TFLOP/s", "efficiency", "per op (us)", "source"):
        table.add_column(header, overflow="fold")
    for dev in DEVICES.values():
        table.add_row(dev.name, f"{dev.peak_flops_per_s / 1e12:.3g}", f"{dev.efficiency:g}",
                      f"{dev.op_overhead_s * 1e6:g}", dev.source)
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
