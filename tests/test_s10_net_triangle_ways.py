"""bench/triangle.py's ways: where kernel shaping cannot run (not root, no ip or tc), the
virtual clock and app pacing still can, and the benchmark says why the kernel way is
left out. It ran the virtual clock alone then, with "app: not run" and no reason.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from asyncsync.schema import ConfigError

TRIANGLE = Path(__file__).parents[1] / "bench" / "triangle.py"
NOT_ROOT = "network.emulation = \"kernel\" needs root (network namespaces and tc)"


def _triangle(monkeypatch: pytest.MonkeyPatch, problem: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("triangle", TRIANGLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def refuse(runs: object) -> None:
        raise ConfigError(problem)

    monkeypatch.setattr(module.netns, "preflight", refuse)
    return module


def test_without_root_the_app_way_still_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = _triangle(monkeypatch, NOT_ROOT).ways("paper_dssync", ["network.server_mbps=80"])
    assert chosen["kernel"] == ([], NOT_ROOT)
    over, note = chosen["app"]
    assert 'network.emulation="app"' in over and "network.server_mbps=80" not in over
    assert note == "no server link (app pacing has none)"
    assert chosen["virtual"][0][-1] == 'clock="virtual"'


def test_a_lossy_recipe_without_root_runs_virtual_only_saying_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = _triangle(monkeypatch, NOT_ROOT).ways("wan_loss", [])
    assert chosen["kernel"] == ([], NOT_ROOT)
    assert chosen["app"][0] == [] and "app pacing cannot drop packets" in chosen["app"][1]
    assert chosen["virtual"][0]


def test_without_netem_a_recipe_with_delay_runs_all_three_ways_without_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = _triangle(monkeypatch, "this host cannot shape delay: it needs the netem "
                       "qdisc").ways("paper_nbsync", [])
    for way in ("virtual", "app", "kernel"):
        over, note = chosen[way]
        assert "network.latency_ms=0" in over and note == "without delay (no netem)", way
