"""A worker waiting for its next request keeps only the vectors its algorithm must keep.

simspeed's memory test, over the other protocols: one worker 100 times slower, so that in
the synchronous ones the others spend nearly all their time waiting for its delta. Before,
their loops kept the last pulled model (the anchor), the last delta or model pushed and,
for SCAFFOLD, the pulled ``c`` and the correction alive across that wait.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_s11_simspeed_population_memory import HIDDEN, vector_censuses

WORKERS = 100
SERVER = 24
"""At most this many vectors besides the workers': the server's model and optimizer state,
the straggler's vectors for its step under way, the evaluation's."""
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


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_a_waiting_worker_keeps_only_its_state(tmp_path: Path, protocol: str) -> None:
    options, kept, pushes = PROTOCOLS[protocol]
    censuses = vector_censuses(recipe_text(options), "run", tmp_path, versions=2)
    # each worker: its parameters, the state it must keep, its pushes of the open round
    bound = WORKERS * (1 + kept + IN_TRANSIT * pushes) + SERVER
    for _, live in censuses:
        assert WORKERS <= live <= bound, (protocol, bound, censuses)
