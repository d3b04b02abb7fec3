"""bench/triangle.py's "msg/model": a message's time over what the link model charges.

The virtual link model delays each direction by the latency plus a uniform draw in
[0, jitter], a mean round trip of ``2 * latency + jitter`` (`LinkSpec.round_trip_s`);
netem's ``delay L+J/2 J/2`` has the same mean. The ratio's model must charge that, or a
jittery link reads as slower than modelled on every clock, the virtual one included.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from asyncsync.study.hetero_specs import NetworkSpec
from asyncsync.study.specs import RunSpec

TRIANGLE = Path(__file__).parents[1] / "bench" / "triangle.py"


def _triangle() -> ModuleType:
    spec = importlib.util.spec_from_file_location("triangle", TRIANGLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_message_as_the_model_charges_it_has_ratio_one_with_jitter(tmp_path: Path) -> None:
    # 8 Mbit/s, 10 ms one way plus jitter in [0, 20] ms: mean round trip 40 ms.
    spec = RunSpec(name="r", workers=1, clock="virtual", network=NetworkSpec(
        bandwidth_mbps=8.0, latency_ms=10.0, jitter_ms=20.0))
    records = [  # 1 MB down is 1 s at 8 Mbit/s; the first held 0.5 s at the server
        {"event": "pull", "t": 0.0, "dur": 1.54, "held_s": 0.5, "up": 0, "down": 1_000_000},
        {"event": "push", "t": 2.0, "dur": 0.54, "held_s": 0.0, "up": 500_000, "down": 0},
        {"event": "pull", "t": 3.0, "dur": 1.04, "held_s": 0.0, "up": 0, "down": 1_000_000}]
    (tmp_path / "worker-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert _triangle().message_ratio(tmp_path, spec) == pytest.approx(1.0)
