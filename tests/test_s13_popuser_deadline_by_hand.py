"""A recipe's fixed deadline checked by hand arithmetic from its capacity trace: `bsp` with
``deadline_s = 0.05`` on two fast devices and one twice as slow, in virtual time.

Each device steps 8 samples (10 ms or 20 ms a sample: 0.08 s and 0.16 s) and moves the
596,008-byte mlp at 100 Mbit/s: 0.0476806 s a way. The fast two report at 0.08 + 0.0477;
the round closes 0.05 s later without the slow one, and they have the new model 0.0477 s
after that: a round every 0.2254 s, the n-th (from 0) closing at 0.1777 + 0.2254 n, so
22 close by 5 s. The slow one reports 0.2554 s apart from 0.2077 on, always after its
round closed (0.0477 + 0.16 + 0.0477 after the version it pulled, which closes 0.2254
after it opened): its 19 reports by 5 s are all dropped."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from asyncsync.cli import main

RECIPE = """name = "dl"
[defaults]
workers = 3
clock = "virtual"
[defaults.stop]
time_s = 5
[defaults.model]
name = "mlp"
[defaults.data]
name = "synthetic"
batch_size = 8
[defaults.optim]
lr = 0.05
[defaults.eval]
interval_s = 5
[defaults.capacity]
trace = "{trace}"
[[runs]]
name = "bsp_dl"
protocol = {{ name = "bsp", deadline_s = 0.05 }}
"""
TRACE = """worker,s_per_sample,up_mbps,down_mbps
0,0.01,100,100
1,0.01,100,100
2,0.02,100,100
"""


def test_a_fixed_deadline_closes_rounds_and_drops_reports_as_by_hand(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cap.csv").write_text(TRACE)
    (tmp_path / "dl.toml").write_text(RECIPE.format(trace=tmp_path / "cap.csv"))
    monkeypatch.chdir(tmp_path)
    assert main(["run", "dl.toml", "--plain", "--jobs", "1", "--logs", "logs"]) == 0
    (folder,) = (tmp_path / "logs" / "dl").iterdir()
    way = 596_008 * 8 / 100e6
    period = 0.08 + way + 0.05 + way
    closes = math.floor((5.0 - (0.08 + way + 0.05)) / period) + 1
    slow_period = 0.16 + 2 * way  # reply at once: its round closed without it
    reports = math.floor((5.0 - (0.16 + way)) / slow_period) + 1
    assert (closes, reports) == (22, 19)
    stop = json.loads((folder / "bsp_dl" / "events.jsonl").read_text().splitlines()[-1])
    assert stop["event"] == "stop"
    assert (stop["versions"], stop["dropped"]) == (closes, reports)
    fast = [json.loads(line) for line in (folder / "bsp_dl" / "worker-0.jsonl").open()]
    held = [entry["held_s"] for entry in fast if entry["event"] == "exchange"]
    # each of its exchanges waited the deadline for the round to close (the last is cut
    # short by the run's end)
    assert len(held) == closes + 1
    assert all(h == pytest.approx(0.05, abs=1e-4) for h in held[:closes])
