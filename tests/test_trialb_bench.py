"""bench/gpu_virtual.py's population figures, from a child's facts (no run)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench" / "gpu_virtual.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_virtual", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_simulated_time_per_round_counts_the_rounds_done_by_the_stop(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Progress is reported each virtual second; a finished run's rounds are counted at
    its stop (4.4 virtual s, 8 rounds: 0.55 s a round), not at its last report (7 rounds
    by 4 s)."""
    bench = _bench()
    finished: dict[str, Any] = {"finished": True, "virtual_s": 4.4, "versions": 8,
                                "reports": [[10.0, 1], [40.0, 7]]}
    monkeypatch.setattr(bench, "in_child", lambda *_: dict(finished))
    args = argparse.Namespace(population_wall_s=100.0)
    facts = bench.population_run(args, torch.device("cpu"), "on", 8, tmp_path)
    assert facts["rounds"] == 8
    assert facts["virtual_per_round_s"] == pytest.approx(0.55)
    assert facts["wall_per_round_s"] == pytest.approx(5.0)  # 30 s over rounds 1 to 7


def test_the_resnet_setting_refuses_a_study_recipe_it_cannot_edit(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The resnet18 figure edits the nbsync study's recipe by text; an edit that finds
    nothing to replace (the recipe changed) must not run the study's own setting (its
    cnn, its 900 virtual s) under the resnet18 label."""
    bench = _bench()
    study = tmp_path / "nbsync.toml"
    study.write_text(bench.STUDY.read_text().replace("time_s = 900", "time_s = 600"))
    monkeypatch.setattr(bench, "STUDY", study)
    ran: list[str] = []
    monkeypatch.setattr(bench, "in_child", lambda recipe, *_: ran.append(recipe) or {})
    args = argparse.Namespace(resnet_virtual_s=40.0, resnet_wall_s=60.0)
    with pytest.raises(SystemExit, match="time_s = 900"):
        bench.resnet_section(args, torch.device("cpu"), tmp_path)
    assert not ran
