"""1,000 clients of a FedScale-like behave trace (a small pickle the test writes), converted
with `convert_behave_trace` and read back as a run reads it: each rank is online exactly
when FedScale's own rule says its client is (``active[i] <= t mod finish_time <=
inactive[i]``), checked at random times away from the intervals' ends."""

from __future__ import annotations

import pickle
import random
from pathlib import Path
from typing import Any

from asyncsync.hetero.availability import load_availability
from asyncsync.hetero.fedscale import convert_behave_trace

CLIENTS, WORKERS, HORIZON_S = 1200, 1000, 500.0


def behave_trace(rng: random.Random) -> dict[int, dict[str, Any]]:
    """FedScale's layout: per client id, 'active' and 'inactive' lists and 'finish_time'
    (some shorter than the horizon, so replayed; client 5 never active; ids from 1)."""
    trace: dict[int, dict[str, Any]] = {}
    for client in range(1, CLIENTS + 1):
        finish = rng.choice([120.0, 300.0, 900.0])
        active, inactive, t = [], [], 0.0
        while (start := t + rng.expovariate(1 / 40)) < finish:
            t = min(start + rng.expovariate(1 / 60), finish)
            active.append(round(start, 3))
            inactive.append(round(t, 3))
        trace[client] = {"active": active, "inactive": inactive, "finish_time": finish,
                         "duration": finish, "model": "x"}
    trace[5] = {"active": [], "inactive": [], "finish_time": 120.0}
    return trace


def fedscale_is_active(entry: dict[str, Any], t: float) -> bool:
    """FedScale's rule (fedscale/core/internal/client.py, ``isActive``), without its cursor."""
    phase = t % float(entry["finish_time"])
    return any(a <= phase <= b for a, b in zip(entry["active"], entry["inactive"], strict=True))


def test_1000_converted_clients_are_online_when_fedscale_says(tmp_path: Path) -> None:
    rng = random.Random(3)
    trace = behave_trace(rng)
    source, out = tmp_path / "client_behave_trace", tmp_path / "availability.csv"
    source.write_bytes(pickle.dumps(trace))
    assert convert_behave_trace(source, out, HORIZON_S, workers=WORKERS, seed=0) == WORKERS
    header = next(line for line in out.read_text().splitlines() if "client ids" in line)
    clients = [int(word) for word in header.split(":", 1)[1].split()]
    assert len(clients) == len(set(clients)) == WORKERS and set(clients) <= set(trace)
    times = load_availability(out, WORKERS)
    checked = 0
    for rank, client in enumerate(clients):
        entry = trace[client]
        ends = [*entry["active"], *entry["inactive"]]
        for _ in range(20):
            t = rng.uniform(0, HORIZON_S)
            if any(abs(t % entry["finish_time"] - end) < 1e-6 for end in ends):
                continue
            assert times[rank].online_at(t) == fedscale_is_active(entry, t), (rank, client, t)
            checked += 1
    assert checked > 19_000
