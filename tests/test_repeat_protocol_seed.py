"""Repeats vary every seed of a run, the protocol's own included.

A protocol with a ``seed`` option (FedAvg's client sampling, DS-Sync's partitions) drew the
same clients or groups in every repeat, so the repeats' spread left that randomness out.
Repeat k now adds k to the protocol's seed as it does to the run's.
"""

from __future__ import annotations

from pathlib import Path

import torch

from asyncsync.protocols import get_protocol
from asyncsync.protocols.fedavg import FedAvgServer
from asyncsync.protocols.testing import FakeStore
from asyncsync.study.recipe import load_recipe

RECIPE = """
name = "seeds"
repeats = 3
[defaults]
workers = 8
seed = 4
clock = "virtual"
[defaults.model]
name = "timing"
size_mb = 1
[defaults.compute]
base_step_s = 0.01
[[runs]]
name = "fedavg"
protocol = {{ name = "fedavg", fraction = 0.25{seed} }}
[[runs]]
name = "dssync"
protocol = {{ name = "dssync", group_size = 2 }}
[[runs]]
name = "bsp"
protocol = "bsp"
"""


def load(tmp_path: Path, seed: str = "") -> list[list[tuple[int, int | None]]]:
    path = tmp_path / "r.toml"
    path.write_text(RECIPE.format(seed=seed))
    recipe = load_recipe(path)
    return [[(r.seed, getattr(r.protocol.params, "seed", None)) for r in recipe.repeated(spec)]
            for spec in recipe.runs]


def test_each_repeat_moves_the_protocols_seed_with_the_runs(tmp_path: Path) -> None:
    fedavg, dssync, bsp = load(tmp_path)
    assert fedavg == [(4, 0), (5, 1), (6, 2)]
    assert dssync == [(4, 0), (5, 1), (6, 2)]
    assert bsp == [(4, None), (5, None), (6, None)]
    fedavg, _, _ = load(tmp_path, seed=", seed = 7")
    assert fedavg == [(4, 7), (5, 8), (6, 9)]


def test_fedavgs_repeats_sample_different_clients(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    path.write_text(RECIPE.format(seed=""))
    recipe = load_recipe(path)
    cohorts = set()
    for spec in recipe.repeated(recipe.run("fedavg")):
        server = get_protocol("fedavg").server(spec.protocol.params, FakeStore(torch.zeros(4), 8))
        assert isinstance(server, FedAvgServer)
        cohorts.add(server.participants(0, range(8)))
    assert len(cohorts) == 3
