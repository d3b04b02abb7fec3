"""NBSync in virtual time: a round lasts a whole number of the slowest worker's steps.

A worker adopts a finished exchange (push, then pull) only at its next step boundary, so
when the exchange takes a little longer than the slowest worker's step, that worker needs
two steps per round instead of one and the run makes half the versions. This is why a few
milliseconds per message that real mode pays and virtual mode does not charge (HTTP, the
server's handling, sleep overshoot of the link emulation) halved nbsync's versions in
bench/fidelity.py: its slowest worker's step (120 ms) was 4.6 ms longer than the exchange
the link model charges (115.4 ms), and real mode's exchange took about 128 ms.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncsync.results.report import summarize_run
from asyncsync.runlog.reading import read_jsonl
from asyncsync.runlog.schema import KEY, Kind
from asyncsync.schema import ConfigError
from asyncsync.study.recipe import load_recipe
from asyncsync.study.simulation import simulate

RECIPE = """
name = "nbsync-rounds"
[defaults]
workers = 2
clock = "virtual"
[defaults.model]
name = "timing"
size_mb = 0.5
[defaults.compute]
base_step_s = 0.03
slowdown = [1, 4]
[defaults.network]
bandwidth_mbps = 100
latency_ms = {latency_ms}
message_overhead_ms = {overhead_ms}
[defaults.stop]
time_s = 12
[[runs]]
name = "nbsync"
protocol = "nbsync"
"""


def nbsync_run(tmp_path: Path, latency_ms: float, overhead_ms: float = 0.0,
               ) -> tuple[int, list[float], list[float]]:
    """Versions, each rank's local steps per push, and the pushes' durations."""
    root = tmp_path / f"lat{latency_ms}-{overhead_ms}"
    root.mkdir()
    path = root / "recipe.toml"
    path.write_text(RECIPE.format(latency_ms=latency_ms, overhead_ms=overhead_ms))
    spec = load_recipe(path).run("nbsync")
    run_dir = root / "nbsync"
    run_dir.mkdir()
    (run_dir / "recipe.json").write_text(json.dumps(
        {"name": "nbsync-rounds", "baseline": "nbsync", "runs": [spec.as_table()]}))
    simulate(spec, run_dir, "nbsync-rounds/nbsync")
    per_push, durations = [], []
    for rank in range(2):
        log = read_jsonl(run_dir / f"worker-{rank}.jsonl")
        pushes = [r for r in log if r[KEY] == Kind.PUSH]
        durations += [r["dur"] for r in pushes]
        per_push.append(sum(r["steps"] for r in log if r[KEY] == Kind.COMPUTE) / len(pushes))
    return int(summarize_run(run_dir)["versions"]), per_push, durations


def test_an_exchange_just_over_the_slowest_step_halves_the_rounds(tmp_path: Path) -> None:
    """0.5 MB over 100 Mbit/s is 40 ms a message, plus 2 x latency. With 5 ms latency the
    exchange takes 2 x 50 = 100 ms, under the slow worker's 120 ms step: one step a round.
    With 11 ms it takes 2 x 62 = 124 ms: two steps a round, half the versions."""
    fast_versions, fast_per_push, fast_pushes = nbsync_run(tmp_path, 5.0)
    slow_versions, slow_per_push, slow_pushes = nbsync_run(tmp_path, 11.0)
    assert fast_pushes == pytest.approx([0.05] * len(fast_pushes), abs=1e-3)
    assert slow_pushes == pytest.approx([0.062] * len(slow_pushes), abs=1e-3)
    assert fast_per_push[1] == pytest.approx(1.0, abs=0.02)
    assert slow_per_push[1] == pytest.approx(2.0, abs=0.05)
    assert fast_per_push[0] == pytest.approx(4.0, abs=0.1)  # the fast worker: 4 x 30 ms
    assert 95 <= fast_versions <= 100  # (12 s - the join) / 120 ms
    assert slow_versions == pytest.approx(fast_versions / 2, abs=2)


def test_a_message_overhead_is_charged_each_way_like_latency(tmp_path: Path) -> None:
    """6 ms of software cost per message on a 5 ms link costs what an 11 ms link does:
    62 ms per push, and the slow worker needs two steps per round."""
    versions, per_push, pushes = nbsync_run(tmp_path, 5.0, overhead_ms=6.0)
    assert pushes == pytest.approx([0.062] * len(pushes), abs=1e-3)
    assert per_push[1] == pytest.approx(2.0, abs=0.05)
    assert 45 <= versions <= 52


def test_a_real_run_refuses_a_message_overhead(tmp_path: Path) -> None:
    path = tmp_path / "recipe.toml"
    path.write_text(RECIPE.format(latency_ms=5, overhead_ms=3).replace(
        'clock = "virtual"', 'clock = "real"'))
    with pytest.raises(ConfigError, match="message_overhead_ms"):
        load_recipe(path)
