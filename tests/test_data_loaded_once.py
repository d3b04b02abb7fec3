"""A virtual run loads its dataset once.

A run whose steps are charged by the model's FLOPs (the quickstart's: no ``base_step_s``)
loaded the dataset twice, once to count the FLOPs and once to train: about 3 s of a
synthetic set-up on 2 cores, and a second copy of a real dataset in memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import asyncsync.study.assembly as assembly
from asyncsync.study.recipe import load_recipe
from asyncsync.study.simulation import simulate
from tests.test_cli import run_main

RECIPE = """
name = "once"

[defaults]
workers = 2
clock = "virtual"
stop = { time_s = 1 }
eval = { interval_s = 1 }
model = { name = "mlp" }

[[runs]]
name = "asp"
protocol = "asp"
"""


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The datasets loaded while the test runs (their arguments)."""
    seen: list[tuple[Any, ...]] = []
    load = assembly.load_dataset

    def counted(*args: Any) -> Any:
        seen.append(args)
        return load(*args)

    monkeypatch.setattr(assembly, "load_dataset", counted)
    return seen


def test_a_flops_charged_virtual_run_loads_its_dataset_once(
        tmp_path: Path, loads: list[tuple[Any, ...]]) -> None:
    (tmp_path / "once.toml").write_text(RECIPE)
    spec = load_recipe(tmp_path / "once.toml").run("asp")
    assert not spec.compute.explicit_step_s  # charged by FLOPs
    run_dir = tmp_path / "asp"
    run_dir.mkdir()
    facts = simulate(spec, run_dir, "once/asp")
    assert facts["step_time_source"] and len(loads) == 1


def test_check_loads_a_dataset_its_runs_share_once(
        tmp_path: Path, loads: list[tuple[Any, ...]],
        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "once.toml"
    path.write_text(RECIPE + '\n[[runs]]\nname = "bsp"\nprotocol = "bsp"\n')
    code, out = run_main(capsys, "check", str(path))
    assert code == 0 and "ok (2 runs" in out
    assert len(loads) == 1  # two runs, two tables (step times, shards), one dataset
