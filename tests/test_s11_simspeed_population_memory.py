"""A 1,000-client virtual population keeps about one model-sized vector per worker.

Workers that are not computing hold their parameters alone: no gradient between local
steps (`asyncsync.training.trainer.ScratchGradients`). Before, every worker kept a gradient
vector beside its parameters from its construction on: twice the tensor memory.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncsync.study.recipe import load_recipe
from asyncsync.study.simulation import simulate

WORKERS = 1000
HIDDEN = 4
FEATURES, CLASSES = 32 * 32, 10  # the synthetic task: 1x32x32 images, 10 classes
SAMPLED = 50  # 5 % of the clients a round
SERVER = 16
"""At most this many vectors on the server's side: its model, its commits, its pool."""
SHARED_ABOVE = 1 << 20
"""Storages larger than this are the run's, not a worker's (the dataset's splits)."""

RECIPE = f"""
name = "population"
[defaults]
workers = {WORKERS}
clock = "virtual"
[defaults.stop]
time_s = 30
[defaults.model]
name = "mlp"
options = {{ hidden = {HIDDEN} }}
[defaults.data]
batch_size = 10
[defaults.eval]
interval_s = 10
[defaults.compute]
base_step_s = 0.01
[defaults.network]
bandwidth_mbps = 20
latency_ms = 40
[[runs]]
name = "fedavg"
protocol = {{ name = "fedavg", local_steps = 5, fraction = 0.05 }}
"""


def live_storages(at_most: int) -> dict[int, torch.UntypedStorage]:
    """Every live CPU tensor storage of at most `at_most` bytes, by address (each once,
    however many tensors view it)."""
    storages: dict[int, torch.UntypedStorage] = {}
    for thing in gc.get_objects():
        if issubclass(type(thing), torch.Tensor) and thing.device.type == "cpu":
            storage = thing.untyped_storage()
            if 0 < storage.nbytes() <= at_most:
                storages[storage.data_ptr()] = storage
    return storages


MLP_PARAMS = FEATURES * HIDDEN + HIDDEN + HIDDEN * HIDDEN + HIDDEN + HIDDEN * CLASSES + CLASSES
"""The mlp's parameters by hand: three linear layers, weights and biases."""


class Enough(Exception):
    """Raised from the status sink once the run has made enough versions: it stops there."""


def vector_censuses(text: str, run: str, tmp_path: Path, versions: int
                    ) -> list[tuple[int, float]]:
    """Run `run` of the recipe `text` (the mlp of `HIDDEN`) until it has made `versions`
    versions: at each status report, its version and the live tensor memory the run made,
    in the mlp's model-sized vectors."""
    recipe = tmp_path / "population.toml"
    recipe.write_text(text)
    spec = load_recipe(recipe).run(run)
    censuses: list[tuple[int, float]] = []
    earlier = live_storages(SHARED_ABOVE)  # other tests' (kept alive: no address reused)

    def census(status: dict[str, Any]) -> None:
        live = sum(storage.nbytes() for address, storage in
                   live_storages(SHARED_ABOVE).items() if address not in earlier)
        censuses.append((status["version"], live / (4 * MLP_PARAMS)))
        if status["version"] >= versions:
            raise Enough

    with pytest.raises(Enough):
        simulate(spec, tmp_path, f"population/{run}", census)
    return censuses


def test_a_population_round_keeps_about_one_vector_per_worker(tmp_path: Path) -> None:
    censuses = vector_censuses(RECIPE, "fedavg", tmp_path, versions=5)
    for _, live in censuses:
        # Every worker's parameters; for the round under way, its clients' pushes (theirs
        # and the server's clone) and pulled models; the server's few vectors. Before:
        # every worker kept a gradient from its construction on (2 vectors a worker), and
        # each client that had pushed kept its last delta twice and its last pulled model
        # while it waited to be sampled again (3 more vectors for each).
        assert WORKERS <= live <= WORKERS + 3 * SAMPLED + SERVER, censuses
        assert live < 1.5 * WORKERS
