"""Virtual time: the same protocol code on a virtual clock, deterministic, leak-proof."""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import json
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncsync import cli
from asyncsync.clock import VirtualTimeError, VirtualTimeLoop, now
from asyncsync.engine.compute import InlineServerSeam
from asyncsync.engine.core import build_core
from asyncsync.engine.settings import ServerSettings
from asyncsync.hetero.network import ServerLink
from asyncsync.results.report import summarize_run
from asyncsync.runlog.reading import read_jsonl
from asyncsync.runlog.schema import KEY, Kind
from asyncsync.schema import ConfigError
from asyncsync.study.assembly import run_data, run_model
from asyncsync.study.hetero_specs import NetworkSpec
from asyncsync.study.recipe import load_recipe
from asyncsync.study.simulation import REAL_TIME_FIELDS, simulate
from asyncsync.study.specs import RunSpec
from asyncsync.transport.local import LocalTransport
from tests.helpers import tiny_model

RECIPE = """
name = "virtual"
[defaults]
workers = 3
clock = "virtual"
[defaults.stop]
time_s = 6
target_accuracy = 0.5
[defaults.model]
name = "mlp"
[defaults.data]
batch_size = 16
[defaults.eval]
interval_s = 1.0
[defaults.compute]
slowdown = [1, 1, 3]
base_step_s = 0.05
[defaults.network]
bandwidth_mbps = 200
latency_ms = 5
jitter_ms = 2
[[runs]]
name = "bsp"
protocol = "bsp"
[[runs]]
name = "asp"
protocol = "asp"
"""


def spec_of(tmp_path: Path, name: str) -> RunSpec:
    path = tmp_path / "virtual.toml"
    path.write_text(RECIPE)
    return load_recipe(path).run(name)


def run(spec: RunSpec, run_dir: Path) -> dict[str, Any]:
    run_dir.mkdir(parents=True)
    (run_dir / "recipe.json").write_text(json.dumps(
        {"name": "virtual", "baseline": spec.name, "runs": [spec.as_table()]}))
    facts = simulate(spec, run_dir, f"virtual/{spec.name}")
    return {**summarize_run(run_dir), **facts}


@pytest.mark.parametrize("protocol", ["bsp", "asp"])
def test_the_same_recipe_and_seed_give_identical_logs(tmp_path: Path, protocol: str) -> None:
    spec = spec_of(tmp_path, protocol)
    first, second = run(spec, tmp_path / "a"), run(spec, tmp_path / "b")
    for name in ["events.jsonl", *(f"worker-{rank}.jsonl" for rank in range(3))]:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert {k: v for k, v in first.items() if k not in REAL_TIME_FIELDS} == {
        k: v for k, v in second.items() if k not in REAL_TIME_FIELDS}
    assert first["wall_s"] == 6.0  # the budget is virtual seconds
    assert first["clock"] == "virtual" and first["base_step_s"] == 0.05
    # what the run cost the host: the model's math and evaluations are part of it
    assert first["math_real_s"] > 0 and first["eval_real_s"] > 0
    assert first["math_real_s"] + first["eval_real_s"] + first["setup_real_s"] <= first["real_s"]
    assert first["setup_real_s"] > 0


def test_virtual_workers_send_no_heartbeats_and_none_is_dropped_for_silence(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A straggler's 3 virtual s steps outlast a 1 s worker timeout: in virtual time no
    heartbeat reaches the server and no worker is dropped (none can fall silent)."""
    from asyncsync.engine.core import ServerCore

    ops: list[str] = []
    handle = ServerCore.handle

    async def counted(self: ServerCore, op: str, *args: Any) -> Any:
        ops.append(op)
        return await handle(self, op, *args)

    monkeypatch.setattr(ServerCore, "handle", counted)
    spec = spec_of(tmp_path, "asp")
    spec = dataclasses.replace(
        spec, fault=dataclasses.replace(spec.fault, heartbeat_s=0.2, worker_timeout_s=1.0),
        compute=dataclasses.replace(spec.compute, slowdown=(1.0, 1.0, 60.0)))
    run(spec, tmp_path / "asp")
    assert "push" in ops and "heartbeat" not in ops
    events = read_jsonl(tmp_path / "asp" / "events.jsonl")
    assert not [e for e in events if e[KEY] == Kind.WORKER_LOST]
    finals = [r for r in read_jsonl(tmp_path / "asp" / "worker-2.jsonl") if r[KEY] == Kind.FINAL]
    assert finals and finals[0]["steps"] >= 1  # the straggler's steps counted to the end


def test_steps_are_charged_base_step_times_slowdown(tmp_path: Path) -> None:
    """asp never waits, and without link costs its messages take no virtual time: in 6
    virtual s a worker does 6 / (0.05 x factor) steps (virtual time is exact: the last
    step ends on the budget's instant, and counts)."""
    spec = dataclasses.replace(spec_of(tmp_path, "asp"), network=NetworkSpec())
    summary = run(spec, tmp_path / "asp")
    finals = [r for rank in range(3) for r in read_jsonl(tmp_path / "asp" / f"worker-{rank}.jsonl")
              if r[KEY] == Kind.FINAL]
    steps = [f["steps"] for f in finals]
    assert steps == [120, 120, 40], steps  # 3x slower; each last step ends at 6 s exactly
    for final, factor in zip(finals, (1, 1, 3), strict=True):
        assert final["compute_s"] == pytest.approx(final["steps"] * 0.05 * factor)
    # every gradient makes a version, but the one each worker computed when the run ended
    assert sum(steps) - 3 <= summary["versions"] <= sum(steps)


def test_a_thread_in_virtual_time_fails_loudly() -> None:
    loop = VirtualTimeLoop()
    try:
        with pytest.raises(VirtualTimeError, match="thread"):
            loop.run_until_complete(asyncio.to_thread(sum, [1, 2]))
    finally:
        loop.close()


def test_a_stuck_run_names_what_waits() -> None:
    loop = VirtualTimeLoop()

    async def waits_forever() -> None:
        await asyncio.Event().wait()

    task = loop.create_task(waits_forever(), name="waits_forever")
    try:
        with pytest.raises(VirtualTimeError, match=r"stuck.*waits_forever"):
            loop.run_until_complete(task)
    finally:
        task.cancel()
        loop.run_until_complete(asyncio.gather(task, return_exceptions=True))
        loop.close()


def test_sleeping_costs_no_real_time() -> None:
    loop = VirtualTimeLoop()

    async def sleepers() -> float:
        await asyncio.gather(*(asyncio.sleep(3600.0 * k) for k in range(1, 5)))
        return now()

    try:
        assert loop.run_until_complete(asyncio.wait_for(sleepers(), 1e6)) == 4 * 3600.0
    finally:
        loop.close()


def test_the_cli_runs_repeats_in_virtual_time(tmp_path: Path) -> None:
    recipe = tmp_path / "virtual.toml"
    recipe.write_text(RECIPE.replace("time_s = 6", "time_s = 3"))
    assert cli.main(["run", str(recipe), "--clock", "virtual", "--repeats", "2", "--plain",
                     "--logs", str(tmp_path / "logs")]) == 0
    runs = sorted(p.parent.name for p in (tmp_path / "logs").rglob("summary.json"))
    assert runs == ["asp-r0", "asp-r1", "bsp-r0", "bsp-r1"]
    summaries = [json.loads(p.read_text()) for p in (tmp_path / "logs").rglob("summary.json")]
    assert {(s["run"], s["seed"], s["clock"]) for s in summaries} == {
        ("bsp", 0, "virtual"), ("bsp", 1, "virtual"), ("asp", 0, "virtual"),
        ("asp", 1, "virtual")}
    rows = (next((tmp_path / "logs").rglob("table.csv"))).read_text().splitlines()
    assert len(rows) == 1 + 4


def test_repeats_must_be_a_positive_integer(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("repeats = 0\n" + RECIPE)
    with pytest.raises(ConfigError, match="repeats"):
        load_recipe(path)


def test_the_servers_link_is_shared_by_every_workers_pushes() -> None:
    """Four simultaneous pushes of S bytes through a server link of B bit/s: they queue,
    and the last is through after about 4 S / B, whatever the workers' own links."""

    async def pushes() -> list[float]:
        core = build_core(tiny_model(), "asp", 4, ServerSettings(worker_timeout_s=None),
                          seam=InlineServerSeam())
        server = ServerLink(8.0)  # 1 MB/s each way
        transports = [LocalTransport(core, None, server) for _ in range(4)]
        joined = await asyncio.gather(*(t.request("join", {"worker": w, "run_id": "run"})
                                        for w, t in enumerate(transports)))
        began = now()

        async def push(worker: int) -> float:
            header = {"worker": worker, "run_id": "run", "base_version": 0, "meta": {},
                      "kind": "gradient", "steps": 1, "samples": 1,
                      "session": joined[worker][0]["meta"]["session"]}
            await transports[worker].request("push", header, torch.zeros(core.store.numel))
            return now() - began

        done = await asyncio.gather(*(push(w) for w in range(4)))
        await core.stop()
        await core.close()
        return sorted(done)

    loop = VirtualTimeLoop()
    try:
        done = loop.run_until_complete(pushes())
    finally:
        loop.close()
    one = 4 * tiny_model_numel() / 1e6  # seconds for one push's tensor at 1 MB/s
    for k, finished in enumerate(done, start=1):
        assert k * one <= finished <= k * one * 1.01 + 0.001, (k, done)


def tiny_model_numel() -> int:
    return sum(p.numel() for p in tiny_model().parameters())


def test_a_sweep_runs_each_value_with_its_own_baseline(tmp_path: Path) -> None:
    recipe = tmp_path / "sweep.toml"
    sweep = "name = \"sweep\"\n[sweep]\nworkers = [2, 4]"
    recipe.write_text(RECIPE.replace("name = \"virtual\"", sweep)
                      .replace("target_accuracy = 0.5", "target_accuracy = 0.3")
                      .replace("slowdown = [1, 1, 3]", "slowdown = [1]"))  # the rest run at 1x
    spec_names = [r.name for r in load_recipe(recipe).runs]
    assert spec_names == ["bsp@workers=2", "asp@workers=2", "bsp@workers=4", "asp@workers=4"]
    assert cli.main(["run", str(recipe), "--repeats", "2", "--plain",
                     "--logs", str(tmp_path / "logs")]) == 0
    summaries = [json.loads(p.read_text()) for p in (tmp_path / "logs").rglob("summary.json")]
    assert sorted((s["run"], s["workers"], s["repeat"]) for s in summaries) == sorted(
        (f"{name}@workers={n}", n, k) for name in ("asp", "bsp") for n in (2, 4)
        for k in range(2))
    rows = list(csv.DictReader(next((tmp_path / "logs").rglob("table.csv")).open()))
    ttt = {(r["run"], r["repeat"]): r["time_to_target_s"] for r in rows}
    compared = 0
    for row in rows:  # every sweep point is compared with its own bsp, repeat by repeat
        base = ttt[(row["run"].replace("asp@", "bsp@"), row["repeat"])]
        if row["run"].startswith("asp@") and base and row["time_to_target_s"]:
            assert float(row["speedup"]) == pytest.approx(
                float(base) / float(row["time_to_target_s"]))
            compared += 1
    assert compared >= 2
    assert next((tmp_path / "logs").rglob("sweep.png")).stat().st_size > 1000


def test_a_sweep_names_its_problem(tmp_path: Path) -> None:
    for sweep, problem in (("workers = []", "non-empty"), ("workers = [2]\nseed = [1]",
                                                            "one key")):
        path = tmp_path / "bad.toml"
        path.write_text(RECIPE.replace('name = "virtual"', f'name = "x"\n[sweep]\n{sweep}'))
        with pytest.raises(ConfigError, match=problem):
            load_recipe(path)


TIMING = """
name = "timing"
[defaults]
workers = 2
clock = "virtual"
[defaults.model]
name = "timing"
size_mb = 10
[defaults.compute]
base_step_s = 0.5
[defaults.network]
bandwidth_mbps = 80
[defaults.stop]
time_s = 30
[[runs]]
name = "bsp"
protocol = "bsp"
"""


def test_a_timing_run_charges_the_declared_size(tmp_path: Path) -> None:
    """A 10 MB model over 10 MB/s links, 0.5 s steps, bsp: joining downloads the model
    (1 s); then each round computes (0.5 s), pushes (1 s) and pulls (1 s) the declared
    size, a version every 2.5 s from t = 2.5, so 11 versions in 30 s."""
    path = tmp_path / "timing.toml"
    path.write_text(TIMING)
    summary = run(load_recipe(path).run("bsp"), tmp_path / "bsp")
    assert summary["versions"] == 11
    assert summary["best_accuracy"] is None  # never evaluated: its accuracy means nothing
    for rank in range(2):
        log = read_jsonl(tmp_path / "bsp" / f"worker-{rank}.jsonl")
        pushes = [r for r in log if r[KEY] == Kind.PUSH]
        assert all(r["up"] == 10_000_000 and r["dur"] == pytest.approx(1.0, abs=1e-3)
                   for r in pushes)
        final = next(r for r in log if r[KEY] == Kind.FINAL)
        assert 11 * 10e6 <= final["bytes_up"] <= 12 * 10e6 + 10_000
        assert final["compute_s"] == pytest.approx(0.5 * final["steps"])
        assert final["compute_s"] / final["wall_s"] == pytest.approx(0.2, abs=0.02)


@pytest.mark.parametrize(("change", "problem"), [
    ('clock = "virtual"', "model.name: the timing model runs on the virtual clock only"),
    ("size_mb = 10", "model.size_mb: the timing model needs its declared size"),
    ("base_step_s = 0.5", "compute.base_step_s: the timing model needs the step time"),
    ("time_s = 30", "stop.target_accuracy: a timing run has no accuracy"),
    ('name = "timing"\nsize_mb', "model.size_mb: only the timing model declares its size"),
])
def test_a_timing_run_names_what_it_lacks(tmp_path: Path, change: str, problem: str) -> None:
    replacement = {'clock = "virtual"': 'clock = "real"', "size_mb = 10": "",
                   "base_step_s = 0.5": "", "time_s = 30": "time_s = 30\ntarget_accuracy = 0.5",
                   'name = "timing"\nsize_mb': 'name = "mlp"\nsize_mb'}[change]
    path = tmp_path / "bad.toml"
    path.write_text(TIMING.replace(change, replacement))
    with pytest.raises(ConfigError, match=problem):
        load_recipe(path)


def test_a_run_model_is_seeded_without_recording_stack_traces(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`torch.manual_seed` queued a seeding of each device backend not yet initialised with
    a stack trace (1.8 ms a worker in a virtual run, in queues that only grow): a run's
    model is seeded on the CPU generator alone, and still from the run's seed."""
    traces: list[int] = []
    monkeypatch.setattr(traceback, "format_stack",
                        lambda *args, **kwargs: traces.append(1) or [])
    spec = load_recipe(Path(__file__).resolve().parents[1] / "recipes" / "quickstart.toml"
                       ).runs[0]
    data = run_data(spec)
    first, second = run_model(spec, data), run_model(spec, data)
    other = run_model(dataclasses.replace(spec, seed=spec.seed + 1), data)
    assert traces == []
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(),
                                                 second.state_dict().values(), strict=True))
    assert not torch.equal(next(first.parameters()), next(other.parameters()))
