"""A worker waiting for its next request keeps only the vectors its algorithm must keep.

simspeed's memory test, over the other protocols: one worker 100 times slower, so that in
the synchronous ones the others spend nearly all their time waiting for its delta. Before,
their loops kept the last pulled model (the anchor), the last delta or model pushed and,
for SCAFFOLD, the pulled ``c`` and the correction alive across that wait.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncsync.study.recipe import load_recipe
from asyncsync.study.simulation import simulate

WORKERS = 100
HIDDEN = 4
FEATURES, CLASSES = 32 * 32, 10  # the synthetic task: 1x32x32 images, 10 classes
SERVER = 24
"""At most this many vectors besides the workers': the server's model and optimizer state,
the straggler's vectors for its step under way, the evaluation's."""
SHARED_ABOVE = 1 << 20
"""Storages larger than this are the run's, not a worker's (the dataset's splits)."""
IN_TRANSIT = 2
"""A pushed vector as it travels, and the server's copy of it for the open round."""

# protocol options; vectors a worker must keep across rounds besides its parameters; pushes
PROTOCOLS: dict[str, tuple[str, int, int]] = {
    # c_i on the worker and the server's latest c_i (the mean c is taken over them); each
    # round pushes c_i+ and the delta
    "scaffold": ('name = "scaffold", local_steps = 2', 2, 2),
    "fednova": ('name = "fednova", local_steps = 2', 0, 1),
    "fedasync": ('name = "fedasync", local_steps = 2', 0, 1),
    "fedbuff": ('name = "fedbuff", local_steps = 2, buffer_size = 3', 0, 1),
    # the anchor is dropped while the worker waits: the pulled model becomes it
    "diloco": ('name = "diloco", inner_steps = 2', 0, 1),
    # the center is pulled afresh each round
    "easgd": ('name = "easgd", local_steps = 2', 0, 1),
    "easgd_async": ('name = "easgd_async", local_steps = 2', 0, 1),
}


def recipe_text(protocol: str) -> str:
    """A 100-worker virtual run of `protocol` on a tiny mlp, worker 0 100 times slower."""
    return f"""
name = "population"
[defaults]
workers = {WORKERS}
clock = "virtual"
[defaults.stop]
time_s = 60
[defaults.model]
name = "mlp"
options = {{ hidden = {HIDDEN} }}
[defaults.data]
batch_size = 10
[defaults.eval]
interval_s = 10
[defaults.compute]
base_step_s = 0.01
slowdown = [100]
[defaults.network]
bandwidth_mbps = 20
latency_ms = 40
[[runs]]
name = "run"
protocol = {{ {protocol} }}
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


class Enough(Exception):
    """Raised from the status sink once two versions are made: the run stops there."""


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_a_waiting_worker_keeps_only_its_state(tmp_path: Path, protocol: str) -> None:
    options, kept, pushes = PROTOCOLS[protocol]
    recipe = tmp_path / "population.toml"
    recipe.write_text(recipe_text(options))
    spec = load_recipe(recipe).run("run")
    # the mlp's parameters by hand: three linear layers, weights and biases
    params = FEATURES * HIDDEN + HIDDEN + HIDDEN * HIDDEN + HIDDEN + HIDDEN * CLASSES + CLASSES
    vector_bytes = 4 * params
    censuses: list[tuple[int, float]] = []  # (version, live vectors) at each status report
    earlier = live_storages(SHARED_ABOVE)  # other tests' (kept alive: no address reused)

    def census(status: dict[str, Any]) -> None:
        live = sum(storage.nbytes() for address, storage in
                   live_storages(SHARED_ABOVE).items() if address not in earlier)
        censuses.append((status["version"], live / vector_bytes))
        if status["version"] >= 2:
            raise Enough

    with pytest.raises(Enough):
        simulate(spec, tmp_path, f"population/{protocol}", census)
    # each worker: its parameters, the state it must keep, its pushes of the open round
    bound = WORKERS * (1 + kept + IN_TRANSIT * pushes) + SERVER
    for _, live in censuses:
        assert WORKERS <= live <= bound, (protocol, bound, censuses)
