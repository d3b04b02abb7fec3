"""A capacity trace's bandwidths shape a kernel-shaped run's links (``network.emulation =
"kernel"``), as they pace an app-paced one.

A user who gave a kernel-shaped run ``capacity.trace`` (2 and 4 Mbit/s for worker 0) saw
its pushes move at some 280 Mbit/s: the namespaces were shaped from the network keys
alone, which a trace leaves unset, so no link had a qdisc. A trace's rate that a tbf
cannot shape is refused before the run, naming the file and the row. No root needed: tc
and ip are recorded, not run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncsync.hetero.network import KERNEL_MBPS
from asyncsync.study import netns
from asyncsync.study.recipe import load_recipe
from tests.test_cli import one_error, run_main

TRACE = [(0, 2.0, 4.0), (1, 3.0, 6.0)]
"""Each row: worker id, up_mbps, down_mbps."""


def _recipe(tmp_path: Path, rows: list[tuple[int, float, float]]) -> Path:
    trace = tmp_path / "capacity.csv"
    trace.write_text("worker,s_per_sample,up_mbps,down_mbps\n" + "".join(
        f"{worker},0.001,{up},{down}\n" for worker, up, down in rows))
    recipe = tmp_path / "traced.toml"
    recipe.write_text(f"""
name = "traced"
[defaults]
workers = 2
[defaults.stop]
time_s = 3
[defaults.model]
name = "mlp"
[defaults.capacity]
trace = "{trace}"
[defaults.network]
emulation = "kernel"
server_mbps = 50
[[runs]]
name = "asp"
protocol = "asp"
""")
    return recipe


def test_a_trace_sets_each_workers_tbf_rates(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    commands: list[tuple[str, ...]] = []

    def record(*args: str) -> str:
        commands.append(args)
        return ""

    monkeypatch.setattr(netns, "_run", record)
    spec = load_recipe(_recipe(tmp_path, TRACE)).runs[0]
    network = netns.RunNetwork.of(spec)
    network.create()
    rates = {(c[2], c[6]): c[c.index("rate") + 1] for c in commands if "tbf" in c}
    bridge = network.namespace("br")
    expected = {(bridge, f"{network.interface('server')}b"): "50mbit",
                (network.namespace("server"), network.interface("server")): "50mbit"}
    for rank, up, down in TRACE:  # uplink on the worker's end, downlink on the bridge's
        role = f"w{rank}"
        expected[(network.namespace(role), network.interface(role))] = f"{up:g}mbit"
        expected[(bridge, f"{network.interface(role)}b")] = f"{down:g}mbit"
    assert rates == expected


def test_a_trace_rate_tc_cannot_shape_is_one_error_line_naming_the_row(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    too_slow = KERNEL_MBPS[0] / 10
    logs = tmp_path / "logs"
    line = one_error(run_main(capsys, "run", str(_recipe(tmp_path, [(0, 2, 4),
                                                                     (7, 3, too_slow)])),
                              "--logs", str(logs)))
    assert "capacity.csv" in line and f"worker 7's down_mbps = {too_slow:g}" in line, line
    assert f"{KERNEL_MBPS[0]:g} to {KERNEL_MBPS[1]:g} Mbit/s" in line, line
    assert not logs.exists()
