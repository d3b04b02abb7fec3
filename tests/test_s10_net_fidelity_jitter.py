"""bench/fidelity.py charges a message what the link model charges: the mean round trip
``2 * latency + jitter`` (each one-way delay is latency plus a uniform draw in
[0, jitter]) and its bytes at the rate.

Without the jitter (``--set network.jitter_ms=...``), its "link model per message" read
lower than the model, and its measured software cost per message took in half the mean
jitter, which the virtual runs then charged on top of the jitter the model draws.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from asyncsync.hetero.network import LinkSpec

BENCH = Path(__file__).parents[1] / "bench"
LINK = LinkSpec(uplink_mbps=8.0, downlink_mbps=8.0, latency_ms=10.0, jitter_ms=20.0)
"""8 Mbit/s: 1 MB is 1 s; 10 ms one way plus a draw in [0, 20] ms: 40 ms round trip."""


def _fidelity(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))  # its `from benchlib import ...`
    spec = importlib.util.spec_from_file_location("fidelity", BENCH / "fidelity.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_link_model_per_message_counts_the_mean_jitter(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    run_dir = tmp_path / "fidelity" / "20261127-000000" / "bsp"
    run_dir.mkdir(parents=True)
    records = [{"event": "push", "t": 0.0, "dur": 1.04, "held_s": 0.0, "up": 1_000_000,
                "down": 0}]
    (run_dir / "worker-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    line = _fidelity(monkeypatch).exchanges(tmp_path, "bsp", LINK)
    assert "push 1040.0" in line and "link model per message 1040.0" in line, line


def test_a_request_is_charged_its_mean_round_trip_and_bytes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    charged = _fidelity(monkeypatch).charged_s
    assert charged(LINK, 1_000_000, 8.0) == pytest.approx(1.04)
    assert charged(LINK, 1_000_000, 0.0) == pytest.approx(0.04)  # unlimited rate
