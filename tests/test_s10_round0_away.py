"""A worker offline at the run's start joins ``away`` (its availability trace says so):
it downloads the model, sends nothing more until it is online, and round 0 neither
draws it nor waits for it."""

from __future__ import annotations

from pathlib import Path

from asyncsync.runlog.reading import read_jsonl
from asyncsync.runlog.schema import KEY, Kind
from asyncsync.study.recipe import load_recipe
from tests.test_availability import simulated, write_trace


def test_a_worker_offline_at_the_start_sends_nothing_until_it_is_online(
        tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.csv", "0,0,20\n1,6,20\n2,0,20\n3,0,20\n")
    recipe = tmp_path / "away.toml"
    recipe.write_text(f"""name = "away"
[defaults]
workers = 4
clock = "virtual"
stop = {{time_s = 10}}
model = {{name = "mlp"}}
data = {{batch_size = 8}}
eval = {{interval_s = 5}}
compute = {{base_step_s = 0.1}}
availability = {{trace = "{trace}"}}
[[runs]]
name = "run"
protocol = {{name = "fedavg", local_steps = 2, fraction = 0.5, overcommit = 0.5}}
""")
    simulated(load_recipe(recipe).run("run"), tmp_path / "run")
    records = read_jsonl(tmp_path / "run" / "worker-1.jsonl")
    sent = [(r[KEY], r["t"]) for r in records
            if r[KEY] in (Kind.PUSH, Kind.PULL, Kind.EXCHANGE, Kind.JOIN)]
    # its first join at 0 (the start barrier), then nothing until it is online at 6
    assert sent[0] == (Kind.JOIN, 0.0) and all(t >= 6.0 for _, t in sent[1:])
    assert [(r["t"], r["until"]) for r in records if r[KEY] == Kind.OFFLINE] == [(0.0, 6.0)]
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    assert [e["worker"] for e in events if e[KEY] == Kind.REJOIN] == [1]
    # rounds went on without it meanwhile
    versions = {r.get("version") for r in read_jsonl(tmp_path / "run" / "worker-0.jsonl")
                if r[KEY] == Kind.EXCHANGE and r["t"] < 6.0}
    assert len(versions) > 3
