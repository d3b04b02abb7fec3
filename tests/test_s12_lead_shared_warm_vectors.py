"""A virtual run's trainers share one pool of warm vectors.

Each trainer had a pool of its own, and a pool keeps the vectors given back to it for
reuse. A DiLoCo worker's first anchor is a snapshot from its pool; once the pulled model
became its anchor, the snapshot went back to the pool and stayed there: 100 waiting
workers kept 100 free vectors, a third of the run's vectors (316.5 model-sized vectors
where FedNova, with the same exchange, kept 215.5).
"""

from __future__ import annotations

from pathlib import Path

from asyncsync.training.buffers import KEEP, TRACK
from tests.test_s11_retain2_population_memory import PROTOCOLS, SERVER, WORKERS, recipe_text
from tests.test_s11_simspeed_population_memory import vector_censuses


def test_waiting_diloco_workers_keep_no_free_vector_each(tmp_path: Path) -> None:
    censuses = vector_censuses(recipe_text(PROTOCOLS["diloco"][0]), "run", tmp_path,
                               versions=2)
    # each worker's parameters and the server's copy of its delta in the open round; the
    # server's vectors; what one shared pool may hold (free and watched lent vectors)
    bound = WORKERS * 2 + SERVER + KEEP + TRACK
    for _, live in censuses:
        assert WORKERS <= live <= bound, (bound, censuses)
